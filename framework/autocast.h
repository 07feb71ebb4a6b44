// AutocastScope: bf16/fp16 autocast for the scope of a forward pass (a family's training step,
// the benches' `--precision`), on CUDA and, for bf16, on the CPU; a no-op for fp32. And the
// autocast state a recomputation in backward captures in forward and replays (AutocastReplay:
// framework/checkpoint.cpp, a family's own recomputed attention).
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/types.h>

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

// Autocast settings of the devices Tessera runs on.
struct AutocastState {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache_enabled = true;
};

inline AutocastState capture_autocast() {
  AutocastState s;
  s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
  s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  s.cuda_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
  s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

inline void apply_autocast(const AutocastState& s) {
  at::autocast::set_autocast_enabled(at::kCPU, s.cpu_enabled);
  at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, s.cuda_enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(s.cache_enabled);
}

// Enters a captured autocast state (a forward's, in its backward) like `with torch.autocast(...)`
// does: it bumps the nesting level and clears the cast-weight cache when the outermost region is
// left; the state before is restored on scope exit.
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastState& forward_state) : outer_(capture_autocast()) {
    apply_autocast(forward_state);
    at::autocast::increment_nesting();
  }
  ~AutocastReplay() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    apply_autocast(outer_);
  }
  AutocastReplay(const AutocastReplay&) = delete;
  AutocastReplay& operator=(const AutocastReplay&) = delete;

 private:
  AutocastState outer_;
};

}  // namespace tessera
