// Per-phase wall time of a training step, always on: a clock read where one phase ends and the
// next begins (a few dozen per step). A family's step charges its phases in order (e.g. sample,
// march, encode, ...; each family's doc lists its own); phase_mark charges the phases of
// the backward pass as autograd crosses from one to the next. The totals of a step go into
// StepRecord::phases: metrics.jsonl ("phase_s"), the progress line under --verbose, and the
// benches' JSON. docs/training_loop.md lists the phases of each family.
//
// On a CUDA device every boundary first waits for the device, so that a phase is charged the
// kernels it queued; that costs the overlap of the host's launches with the device's work.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

using PhaseTimes = std::vector<std::pair<std::string, double>>;  // (phase, seconds), in order

class PhaseTimer {
 public:
  explicit PhaseTimer(torch::Device device = torch::kCPU) : device_(device) {}

  // A new step: the totals cleared, the clock started.
  void start();
  // Charges the time since the last boundary to `phase` (added to its total when the phase came
  // before in this step) and starts the next phase.
  void lap(const std::string& phase);
  // Starts the next phase without charging the time since the last boundary to any (work that
  // another timer charges, such as the run's skip check between forward_backward and apply_step).
  void skip();
  // Charges `seconds` of work that ran inside the current phase to `phase` instead (the
  // recompute of a checkpointed segment inside "backward"): the current phase is not charged
  // them when its boundary comes.
  void charge_nested(const std::string& phase, double seconds);
  // The totals of the step so far, in the order the phases first came.
  const PhaseTimes& times() const { return times_; }

 private:
  void wait_for_device() const;
  torch::Device device_;
  std::chrono::steady_clock::time_point mark_ = std::chrono::steady_clock::now();
  PhaseTimes times_;
};

// Adds `seconds` to `phase` in `times`, appending the phase when it is not there yet.
void add_phase(PhaseTimes& times, const std::string& phase, double seconds);

// An identity on x (no copy) whose backward charges `phase` on `timer`: placed where a forward
// value is made, it marks the point where the backward pass has finished with everything that
// consumed it. A null timer or a tensor without grad returns x.
torch::Tensor phase_mark(const torch::Tensor& x, PhaseTimer* timer, const std::string& phase);

// The median over steps of each phase's seconds (a phase missing from a step counts as 0 there),
// in the order the phases first came; for the benches' JSON.
PhaseTimes median_phases(const std::vector<PhaseTimes>& steps);

}  // namespace tessera
