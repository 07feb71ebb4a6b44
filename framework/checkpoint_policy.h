// Checkpoint policies: given a model's named segments (and their measured activation bytes),
// decide which segments to checkpoint. Built by name: "none", "segments", "budget".
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/checkpoint.h"

namespace tessera {

// One segment of a model, in forward order. Bytes and seconds come from measure_segment() on a
// dry run.
struct SegmentInfo {
  std::string name;
  int64_t activation_bytes = 0;  // stored until backward when the segment is kept: its saved
                                 // activations plus its outputs
  int64_t boundary_bytes = 0;    // stored when it is checkpointed: its outputs, which stay
                                 // alive as the next segment's saved inputs (or the model output)
  double recompute_seconds = 0;  // its forward's wall time: what checkpointing it adds to a
                                 // step (0 when not measured; "budget" then counts segments)
};

// A policy's answer, with the plan the trainer logs per rank.
//
// The memory model (docs/checkpointing.md): at the end of forward every kept segment stores its
// activations and every checkpointed one its boundary (stored_bytes). Backward visits the
// segments last to first; when it reaches a checkpointed segment k, everything after k has been
// released and k's activations are recomputed while the segments before k still store theirs:
// sum_{i<k} stored_i + activation_k. The predicted peak is the largest of these and the end of
// forward. (Gradient buffers, the same under every plan, are not counted.) So checkpointing the
// last segment never lowers the peak: its recompute comes first and holds what keeping it holds.
struct CheckpointPlan {
  std::vector<bool> checkpointed;  // per segment, in the order given
  int64_t stored_bytes = 0;        // predicted bytes stored at the end of forward
  int64_t peak_bytes = 0;          // predicted peak, recomputes included (see above)
  double recompute_seconds = 0;    // sum of the checkpointed segments' recompute_seconds
  int64_t budget_bytes = -1;       // the budget, -1 when the policy has none
  bool fits = true;                // peak_bytes <= budget_bytes (true without a budget)
  std::string text;                // human-readable: one line per segment, then the totals

  bool is_checkpointed(size_t segment) const { return checkpointed.at(segment); }
  size_t num_checkpointed() const;
};

// Settings of all policies; each reads its own (from config section [checkpoint]).
struct CheckpointPolicyOptions {
  std::vector<std::string> segments;  // "segments": checkpoint these by name
  int64_t every = 0;                  // "segments": and every N-th (the N-th, 2N-th, ...; 1 = all
                                      // but the last, whose checkpoint would lower nothing)
  double budget_mib = 0.0;            // "budget": per-rank activation memory budget, MiB (> 0):
                                      // the predicted peak, recomputes included
};

class CheckpointPolicy {
 public:
  virtual ~CheckpointPolicy() = default;
  virtual std::string name() const = 0;
  // Throws UserError when the policy names a segment that is not in `segments`.
  virtual CheckpointPlan plan(const std::vector<SegmentInfo>& segments) const = 0;
};

// Known policy names, sorted.
std::vector<std::string> checkpoint_policy_names();

// Builds a policy by name. Unknown name or bad options -> UserError (listing the known names).
std::unique_ptr<CheckpointPolicy> make_checkpoint_policy(
    const std::string& name, const CheckpointPolicyOptions& options = {});

// What one segment stores, measured on a dry run (forward with grad; nothing is kept afterwards).
struct SegmentMeasurement {
  int64_t activation_bytes = 0;  // allocated during the forward and still held with the outputs
                                 // alive: saved activations + outputs (see SegmentInfo)
  int64_t output_bytes = 0;      // bytes of the outputs' storages not shared with the inputs
  int64_t peak_bytes = 0;        // transient peak above the start during the forward
  double forward_seconds = 0;    // wall time of the forward (what a recompute costs); on a CUDA
                                 // device after waiting for it
};

// Runs `fn(inputs)` with grad enabled on `device` and measures it (memory on the first run, time
// on a second) with the memory accounting of
// framework/memory.h (installs the counting CPU allocator when device is CPU). Throws
// std::runtime_error when the device's memory cannot be measured.
SegmentMeasurement measure_segment(const SegmentFn& fn, const std::vector<torch::Tensor>& inputs,
                                   torch::Device device);

}  // namespace tessera
