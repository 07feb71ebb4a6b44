// LossScaler: option validation, loss scaling, the non-finite count with in-place unscaling,
// and the backoff/growth update, with its snapshot state.
#include "framework/loss_scaler.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "distributed/errors.h"
#include "kernels/nonfinite.h"

namespace tessera {
namespace {

constexpr size_t kStateSize = 3;  // scale, good_steps, skipped_steps

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

LossScaler::LossScaler(LossScalerOptions o) : options_(o), scale_(o.init_scale) {
  if (!(o.init_scale > 0.0) || !std::isfinite(o.init_scale))
    throw UserError("loss scaler: init_scale = " + num(o.init_scale) +
                    " must be a finite number > 0");
  if (!(o.growth_factor > 1.0) || !std::isfinite(o.growth_factor))
    throw UserError("loss scaler: growth_factor = " + num(o.growth_factor) + " must be > 1");
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0))
    throw UserError("loss scaler: backoff_factor = " + num(o.backoff_factor) +
                    " must lie in (0, 1)");
  if (o.growth_interval < 1)
    throw UserError("loss scaler: growth_interval = " + std::to_string(o.growth_interval) +
                    " must be >= 1");
}

double LossScaler::scale() const { return options_.enabled ? scale_ : 1.0; }

torch::Tensor LossScaler::scale_loss(const torch::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_;
}

int64_t LossScaler::unscale_and_count_nonfinite(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  // Sum the per-tensor counts on the device and read back once: one host sync per step.
  torch::Tensor total;
  for (const torch::Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    torch::Tensor c = kernels::count_nonfinite(g);
    if (total.defined() && c.device() != total.device()) c = c.to(total.device());
    total = total.defined() ? total + c : c;
  }
  const int64_t count = total.defined() ? total.item<int64_t>() : 0;
  if (count == 0 && options_.enabled && scale_ != 1.0) {
    for (const torch::Tensor& g : grads)
      if (g.defined() && g.numel() > 0) g.div_(scale_);
  }
  return count;
}

bool LossScaler::update(bool found_inf) {
  if (found_inf) {
    ++skipped_steps_;
    good_steps_ = 0;
    if (options_.enabled) scale_ *= options_.backoff_factor;
    return true;
  }
  if (!options_.enabled) return false;
  if (++good_steps_ >= options_.growth_interval) {
    // As GradScaler: never grow into an infinite scale.
    if (std::isfinite(scale_ * options_.growth_factor)) scale_ *= options_.growth_factor;
    good_steps_ = 0;
  }
  return false;
}

std::vector<double> LossScaler::state() const {
  return {scale_, static_cast<double>(good_steps_), static_cast<double>(skipped_steps_)};
}

void LossScaler::load_state(const std::vector<double>& state) {
  if (state.size() != kStateSize)
    throw UserError("loss scaler: snapshot state has " + std::to_string(state.size()) +
                    " values, expected " + std::to_string(kStateSize) +
                    " (scale, good_steps, skipped_steps)");
  const double scale = state[0], good = state[1], skipped = state[2];
  if (!(scale > 0.0) || !std::isfinite(scale) || !(good >= 0.0) || !(skipped >= 0.0) ||
      good != std::floor(good) || skipped != std::floor(skipped))
    throw UserError("loss scaler: snapshot state {" + num(scale) + ", " + num(good) + ", " +
                    num(skipped) + "} is invalid (scale > 0, integer counters >= 0)");
  scale_ = scale;
  good_steps_ = static_cast<int64_t>(good);
  skipped_steps_ = static_cast<int64_t>(skipped);
}

}  // namespace tessera
