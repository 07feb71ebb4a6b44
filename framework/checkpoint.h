// Activation checkpointing for LibTorch (which has none): run a segment without keeping its
// activations and recompute it, with the same RNG and autocast state, during backward.
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

namespace tessera {

class PhaseTimer;

// A checkpointable segment: tensors in, tensors out. It may use parameters captured from outside
// (a Module's weights); their gradients accumulate into .grad during the outer backward.
using SegmentFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

struct CheckpointOptions {
  // Stash the CPU generator (and the CUDA generators of the inputs' devices) at forward and
  // replay it for the recompute, so dropout and sampling jitter recompute identically
  // (docs/checkpointing.md, invariant 3). Turning it off exists for tests and for segments known to draw no
  // random numbers; it is never what the trainer wants.
  bool preserve_rng_state = true;
  // When set, the wall time of the recompute (the segment's second forward, in backward) is
  // charged to phase "recompute" of this timer instead of to the phase around it ("backward");
  // the gradient through the recomputed graph stays with the phase around it. On a CUDA device
  // the timer waits for the device before and after the recompute, as at every phase boundary.
  PhaseTimer* phases = nullptr;
};

// Runs `fn(inputs)` without recording activations and returns its outputs. Only the inputs are
// saved. On backward, `fn` is re-run with grad enabled on detached copies of the inputs (same
// requires_grad), under the RNG and autocast state of the forward, and the incoming gradients are
// back-propagated through the recomputed graph (the reentrant scheme of torch.utils.checkpoint):
//   - gradients of the inputs are returned to the outer graph;
//   - gradients of parameters captured by `fn` ACCUMULATE into their .grad while the outer
//     backward runs. This is what loss.backward() in the trainer wants; it also means that
//     torch::autograd::grad(outputs, params) does NOT see them (use backward() and read .grad).
// Outputs of a non-differentiable dtype (integers, bool) and undefined outputs are returned as
// they are. Floating outputs are attached to the checkpoint node; one that does not depend on
// anything requiring grad simply receives no gradient (its recomputed twin does not require grad).
// When grad mode is off (eval, torch::NoGradGuard) `fn` is just called.
// Not supported: double backward through a checkpoint (create_graph), and random draws on a CUDA
// device that none of the inputs lives on (that generator is not stashed).
std::vector<torch::Tensor> checkpoint(const SegmentFn& fn, const std::vector<torch::Tensor>& inputs,
                                      const CheckpointOptions& options = {});

}  // namespace tessera
