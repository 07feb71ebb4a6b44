// AutocastScope: bf16/fp16 autocast on CUDA for the scope of a forward pass (the Trainer's steps,
// `tessera bench nerf --precision`); a no-op for fp32 and on the CPU.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <string>

namespace tessera {

class AutocastScope {
 public:
  AutocastScope(const std::string& precision, torch::Device device)
      : active_(precision != "fp32" && device.is_cuda()) {
    if (!active_) return;
    at::autocast::set_autocast_dtype(at::kCUDA, precision == "bf16" ? at::kBFloat16 : at::kHalf);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  ~AutocastScope() {
    if (!active_) return;
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_;
};

}  // namespace tessera
