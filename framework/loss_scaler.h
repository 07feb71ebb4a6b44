// Dynamic loss scaling for fp16 training, with the rules of torch.cuda.amp.GradScaler: back off
// on a non-finite gradient and skip the step; grow after growth_interval good steps in a row.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace tessera {

struct LossScalerOptions {
  bool enabled = false;
  double init_scale = 65536.0;    // 2^16, as GradScaler
  double growth_factor = 2.0;     // > 1
  double backoff_factor = 0.5;    // in (0, 1)
  int64_t growth_interval = 2000; // >= 1 consecutive good steps before a growth
};

// The scale, the good-step counter and the skip counter are the whole state; update() is a pure
// function of it and of the agreed found_inf flag, so every rank keeps the same scale.
class LossScaler {
 public:
  // Validates the options; throws tessera::UserError naming the problem.
  explicit LossScaler(LossScalerOptions options);

  double scale() const;  // 1.0 when disabled
  const LossScalerOptions& options() const { return options_; }

  torch::Tensor scale_loss(const torch::Tensor& loss) const;  // loss * scale (loss when disabled)

  // Counts the non-finite values in the gradients (undefined tensors are skipped) and, when all
  // are finite, unscales them in place (grad /= scale). Returns the local count; the caller
  // reduces it across ranks (max) and passes the agreed flag to update().
  int64_t unscale_and_count_nonfinite(const std::vector<torch::Tensor>& grads);

  // found_inf: the AGREED flag. On inf: scale *= backoff and the step must be skipped; else,
  // after growth_interval consecutive good steps, scale *= growth. Returns true when the step
  // must be skipped. Disabled: the scale stays 1, and a non-finite step is still skipped.
  bool update(bool found_inf);

  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t good_steps() const { return good_steps_; }  // consecutive good steps since last change

  // For snapshots: {scale, good_steps, skipped_steps}, and its restore (validated).
  std::vector<double> state() const;
  void load_state(const std::vector<double>& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace tessera
