// kernels/pointwise.h: one scalar loop per op on the CPU (tessera::parallel_for: every element
// gets the same code whatever the split), torch's ops elsewhere; exp and sigmoid as autograd
// functions whose backward is exact arithmetic on the saved output.
#include "kernels/pointwise.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/logit.h>
#include <torch/autograd.h>

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace tessera::kernels::pointwise {

namespace {

constexpr int64_t kValuesPerTask = 1 << 14;

// f applied to every element of x by the same scalar code.
template <typename F>
at::Tensor map_cpu(const at::Tensor& x, const F& f) {
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty_like(in);
  AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "pointwise", [&] {
    const scalar_t* a = in.data_ptr<scalar_t>();
    scalar_t* b = out.data_ptr<scalar_t>();
    tessera::parallel_for(0, in.numel(), kValuesPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) b[i] = f(a[i]);
    });
  });
  return out;
}

at::Tensor exp_forward(const at::Tensor& x) {
  if (!x.is_cpu()) return x.exp();
  return map_cpu(x, [](auto v) { return std::exp(v); });
}

at::Tensor sigmoid_forward(const at::Tensor& x) {
  if (!x.is_cpu()) return x.sigmoid();
  return map_cpu(x, [](auto v) {
    using T = decltype(v);
    return T(1) / (T(1) + std::exp(-v));
  });
}

class ExpFunction : public torch::autograd::Function<ExpFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor y = exp_forward(x);
    ctx->save_for_backward({y});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0]};
  }
};

class SigmoidFunction : public torch::autograd::Function<SigmoidFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor y = sigmoid_forward(x);
    ctx->save_for_backward({y});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    return {grads[0] * (y * (1 - y))};
  }
};

}  // namespace

at::Tensor exp(const at::Tensor& x) { return ExpFunction::apply(x); }

at::Tensor sigmoid(const at::Tensor& x) { return SigmoidFunction::apply(x); }

at::Tensor log(const at::Tensor& x) {
  if (!x.is_cpu()) return x.log();
  return map_cpu(x, [](auto v) { return std::log(v); });
}

at::Tensor logit(const at::Tensor& x) {
  if (!x.is_cpu()) return at::logit(x);
  return map_cpu(x, [](auto v) {
    using T = decltype(v);
    return std::log(v / (T(1) - v));
  });
}

}  // namespace tessera::kernels::pointwise
