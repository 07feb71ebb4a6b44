// AutocastScope: bf16/fp16 autocast for the scope of a forward pass (a family's training step,
// `tessera bench nerf --precision`), on CUDA and, for bf16, on the CPU; a no-op for fp32.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <string>

namespace tessera {

class AutocastScope {
 public:
  AutocastScope(const std::string& precision, torch::Device device)
      : active_(precision != "fp32"), type_(device.type()) {
    if (!active_) return;
    at::autocast::set_autocast_dtype(type_, precision == "bf16" ? at::kBFloat16 : at::kHalf);
    at::autocast::set_autocast_enabled(type_, true);
  }
  ~AutocastScope() {
    if (!active_) return;
    at::autocast::set_autocast_enabled(type_, false);
    at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_;
  c10::DeviceType type_;
};

}  // namespace tessera
