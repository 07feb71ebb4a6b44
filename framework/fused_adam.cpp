// adam_step (see fused_adam.h). Compiled with -O3 -fno-math-errno (framework/CMakeLists.txt) so
// that the per-element loop vectorizes (sqrt without errno).
#include "framework/fused_adam.h"
#include "kernels/cpu/parallel.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <memory>

namespace tessera {

namespace {

constexpr int64_t kValuesPerTask = 1 << 15;

bool fusable(const torch::Tensor& p, const torch::optim::AdamOptions& o) {
  const torch::Tensor& g = p.grad();
  return p.is_cpu() && p.scalar_type() == torch::kFloat32 && p.is_contiguous() && g.defined() &&
         g.is_cpu() && g.scalar_type() == torch::kFloat32 && g.is_contiguous() && !g.is_sparse() &&
         !o.amsgrad() && o.weight_decay() == 0;
}

// m = b1 m + c1 g;  v = b2 v + c2 g^2;  p -= step_size m / (sqrt(v) / sqrt(bc2) + eps), with
// c1 = 1 - beta1 and c2 = 1 - beta2 computed in double and rounded once, as torch does.
void update(float* p, const float* g, float* m, float* v, int64_t n, float b1, float c1,
            float b2, float c2, float sqrt_bc2, float eps, float step_size) {
  // Everything by value: a chunk's loop then reads the scalars from registers. Captured by
  // reference, they are loads through the closure that the stores to m, v and p might alias (the
  // closure escapes to the OpenMP pool), which keeps GCC from vectorizing the loop.
  tessera::parallel_for(0, n, kValuesPerTask, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float gi = g[i];
      const float mi = m[i] * b1 + gi * c1;
      const float vi = v[i] * b2 + gi * gi * c2;
      m[i] = mi;
      v[i] = vi;
      p[i] -= step_size * (mi / (std::sqrt(vi) / sqrt_bc2 + eps));
    }
  });
}

}  // namespace

void adam_step(torch::optim::Adam& adam) {
  for (auto& group : adam.param_groups())
    for (const torch::Tensor& p : group.params())
      if (p.grad().defined() &&
          !fusable(p, static_cast<const torch::optim::AdamOptions&>(group.options()))) {
        adam.step();  // one parameter torch must handle: torch's step for all, as before
        return;
      }
  torch::NoGradGuard no_grad;
  for (auto& group : adam.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto it = adam.state().find(p.unsafeGetTensorImpl());
      if (it == adam.state().end()) {
        auto fresh = std::make_unique<torch::optim::AdamParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = adam.state().emplace(p.unsafeGetTensorImpl(), std::move(fresh)).first;
      }
      auto& state = static_cast<torch::optim::AdamParamState&>(*it->second);
      torch::Tensor& m = state.exp_avg();
      torch::Tensor& v = state.exp_avg_sq();
      if (!m.is_contiguous()) m = m.contiguous();
      if (!v.is_contiguous()) v = v.contiguous();
      state.step(state.step() + 1);
      const double bc1 = 1 - std::pow(beta1, static_cast<double>(state.step()));
      const double bc2 = 1 - std::pow(beta2, static_cast<double>(state.step()));
      update(p.data_ptr<float>(), p.grad().data_ptr<float>(), m.data_ptr<float>(),
             v.data_ptr<float>(), p.numel(), static_cast<float>(beta1),
             static_cast<float>(1 - beta1), static_cast<float>(beta2), static_cast<float>(1 - beta2),
             static_cast<float>(std::sqrt(bc2)), static_cast<float>(o.eps()),
             static_cast<float>(o.lr() / bc1));
    }
  }
}

}  // namespace tessera
