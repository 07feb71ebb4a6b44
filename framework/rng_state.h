// The states of torch's default random generators (the CPU's and each CUDA device's), saved and
// put back: activation checkpointing replays the forward's draws in the recompute
// (framework/checkpoint.cpp), and dry forwards that only measure (the point denoiser's memory
// plans) leave the run's random stream as it was.
#pragma once

#include <c10/core/Device.h>
#include <torch/types.h>

#include <utility>
#include <vector>

namespace tessera {

struct RngState {
  torch::Tensor cpu;                                        // [5056] uint8 (mt19937 + normal cache)
  std::vector<std::pair<c10::Device, torch::Tensor>> cuda;  // per device, Philox seed + offset
};

// The CPU generator and the default generator of every CUDA device among `devices`. CUDA is
// already initialized when a tensor lives there, so defaultGenerator() does not start it.
RngState capture_rng(const std::vector<c10::Device>& devices);
void restore_rng(const RngState& state);

// Captures the states on construction and puts them back on destruction: what runs in between
// draws without changing what the rest of the run draws.
class RngStateGuard {
 public:
  explicit RngStateGuard(const std::vector<c10::Device>& devices) : saved_(capture_rng(devices)) {}
  ~RngStateGuard() { restore_rng(saved_); }
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  RngState saved_;
};

}  // namespace tessera
