// PhaseTimer and phase_mark (see phase_timer.h).
#include "framework/phase_timer.h"

#include <torch/autograd.h>
#include <torch/cuda.h>

#include <algorithm>

namespace tessera {

namespace {

// The identity whose backward is a phase boundary.
class PhaseMarkFunction : public torch::autograd::Function<PhaseMarkFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               int64_t timer, const std::string& phase) {
    ctx->saved_data["timer"] = timer;
    ctx->saved_data["phase"] = phase;
    ctx->set_materialize_grads(false);
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* timer = reinterpret_cast<PhaseTimer*>(ctx->saved_data["timer"].toInt());
    timer->lap(ctx->saved_data["phase"].toStringRef());
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void PhaseTimer::start() {
  times_.clear();
  wait_for_device();
  mark_ = std::chrono::steady_clock::now();
}

void PhaseTimer::lap(const std::string& phase) {
  wait_for_device();
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - mark_).count();
  mark_ = now;
  add_phase(times_, phase, seconds);
}

void PhaseTimer::charge_nested(const std::string& phase, double seconds) {
  add_phase(times_, phase, seconds);
  mark_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
}

void add_phase(PhaseTimes& times, const std::string& phase, double seconds) {
  for (auto& [name, total] : times)
    if (name == phase) {
      total += seconds;
      return;
    }
  times.emplace_back(phase, seconds);
}

void PhaseTimer::skip() {
  wait_for_device();
  mark_ = std::chrono::steady_clock::now();
}

void PhaseTimer::wait_for_device() const {
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
}

torch::Tensor phase_mark(const torch::Tensor& x, PhaseTimer* timer, const std::string& phase) {
  if (timer == nullptr || !x.requires_grad() || !torch::GradMode::is_enabled()) return x;
  return PhaseMarkFunction::apply(x, static_cast<int64_t>(reinterpret_cast<intptr_t>(timer)),
                                  phase);
}

PhaseTimes median_phases(const std::vector<PhaseTimes>& steps) {
  PhaseTimes out;
  for (const PhaseTimes& step : steps)
    for (const auto& phase : step)  // (a lambda may not capture a structured binding in C++17)
      if (std::none_of(out.begin(), out.end(), [&](const auto& p) { return p.first == phase.first; }))
        out.emplace_back(phase.first, 0.0);
  for (auto& [name, median] : out) {
    std::vector<double> values;
    for (const PhaseTimes& step : steps) {
      double v = 0;
      for (const auto& [n, seconds] : step)
        if (n == name) v = seconds;
      values.push_back(v);
    }
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    median = n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
  }
  return out;
}

}  // namespace tessera
