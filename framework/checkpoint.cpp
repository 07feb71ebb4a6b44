// checkpoint(): a torch::autograd::Function that keeps only a segment's inputs and recomputes it
// in backward, replaying the RNG and autocast state of the forward (docs/checkpointing.md, invariant 3).
//
// Why a torch::autograd::Function and not a hand-written Node: in LibTorch 2.11,
// Function<T>::apply() extracts every tensor of an at::TensorList argument as a separate
// differentiable input (ExtractVariables has an overload for `const at::TensorList&`; a
// std::vector<Tensor> would fall into the catch-all template and be treated as a non-tensor),
// and it already does what a custom Node would have to redo by hand: collect the next edges,
// wrap outputs (non-differentiable dtypes stay without grad_fn, an output that is an input
// becomes a view), check the version counters of saved inputs, and validate the gradients
// returned by backward. The non-tensor state (the segment callable, the stashed RNG and autocast
// state) is carried to backward in ctx->saved_data as an IValue capsule.
#include "framework/checkpoint.h"

#include <ATen/autocast_mode.h>

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include "framework/autocast.h"
#include "framework/phase_timer.h"
#include "framework/rng_state.h"

namespace tessera {
namespace {

// Installs the forward's generator states and puts the outer ones back on destruction, so the
// recompute draws the same numbers and the rest of the run continues as if nothing was redrawn.
class RngReplay {
 public:
  RngReplay(const RngState* stashed, const std::vector<c10::Device>& devices) : active_(stashed) {
    if (!active_) return;
    outer_ = capture_rng(devices);
    restore_rng(*stashed);
  }
  ~RngReplay() {
    if (active_) restore_rng(outer_);
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  bool active_;
  RngState outer_;
};

// Everything backward needs besides the saved inputs.
struct CheckpointState : torch::CustomClassHolder {
  SegmentFn fn;
  CheckpointOptions options;
  size_t num_inputs = 0;                // size of fn's argument
  std::vector<size_t> defined_inputs;   // positions of the defined ones: the Function's inputs
                                        // (undefined tensors cannot be Function inputs); one
                                        // more trailing Function input, if any, is the anchor
  std::vector<size_t> defined_outputs;  // positions (in fn's result) of the defined outputs
  size_t num_outputs = 0;               // size of fn's result
  std::vector<c10::Device> devices;     // devices of the inputs
  RngState rng;                         // valid when options.preserve_rng_state
  AutocastState autocast;
};

c10::intrusive_ptr<CheckpointState> unpack_state(const c10::IValue& capsule) {
  auto holder = capsule.toCapsule();
  return c10::intrusive_ptr<CheckpointState>::reclaim(
      static_cast<CheckpointState*>(holder.release()));
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // inputs: fn's inputs, then possibly the grad anchor (see checkpoint()).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<CheckpointState> state,
                                                at::TensorList inputs) {
    ctx->save_for_backward(inputs.vec());
    for (const torch::Tensor& t : inputs)
      if (t.defined() && std::find(state->devices.begin(), state->devices.end(), t.device()) ==
                             state->devices.end())
        state->devices.push_back(t.device());
    if (state->options.preserve_rng_state) state->rng = capture_rng(state->devices);
    state->autocast = capture_autocast();

    std::vector<torch::Tensor> outputs;
    {
      torch::NoGradGuard no_grad;  // apply() already disables grad; explicit for the reader
      std::vector<torch::Tensor> args(state->num_inputs);
      for (size_t k = 0; k < state->defined_inputs.size(); ++k)
        args[state->defined_inputs[k]] = inputs[k];
      outputs = state->fn(args);
    }
    state->num_outputs = outputs.size();
    torch::autograd::variable_list defined;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].defined()) continue;
      state->defined_outputs.push_back(i);
      defined.push_back(outputs[i]);
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return defined;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto state = unpack_state(ctx->saved_data.at("state"));
    torch::autograd::variable_list saved = ctx->get_saved_variables();

    // Leaves for the recompute: same values, same requires_grad, no history.
    const size_t num_defined = state->defined_inputs.size();
    std::vector<torch::Tensor> leaves(num_defined);
    for (size_t k = 0; k < num_defined; ++k) {
      leaves[k] = saved[k].detach();
      leaves[k].set_requires_grad(saved[k].requires_grad());
    }

    std::vector<torch::Tensor> outputs;
    PhaseTimer* const timer = state->options.phases;
    auto wait_for_devices = [&] {
      for (const c10::Device& d : state->devices)
        if (d.is_cuda()) torch::cuda::synchronize(d.index());
    };
    if (timer != nullptr) wait_for_devices();
    const auto recompute_start = std::chrono::steady_clock::now();
    {
      RngReplay rng(state->options.preserve_rng_state ? &state->rng : nullptr, state->devices);
      AutocastReplay autocast(state->autocast);
      torch::AutoGradMode grad_on(true);
      std::vector<torch::Tensor> args(state->num_inputs);
      for (size_t k = 0; k < num_defined; ++k) args[state->defined_inputs[k]] = leaves[k];
      outputs = state->fn(args);
    }
    if (timer != nullptr) {
      wait_for_devices();
      timer->charge_nested("recompute", std::chrono::duration<double>(
                                            std::chrono::steady_clock::now() - recompute_start)
                                            .count());
    }
    if (outputs.size() != state->num_outputs)
      throw std::runtime_error("checkpoint: the segment returned " +
                               std::to_string(outputs.size()) + " outputs on recompute but " +
                               std::to_string(state->num_outputs) +
                               " in forward; a checkpointed segment must be deterministic");

    // Back-propagate through the recomputed graph. Parameters captured by fn accumulate into
    // their .grad here, during the outer backward.
    torch::autograd::variable_list roots, root_grads;
    for (size_t k = 0; k < state->defined_outputs.size(); ++k) {
      const torch::Tensor& out = outputs[state->defined_outputs[k]];
      if (!out.defined() || !out.requires_grad() || !grad_outputs[k].defined()) continue;
      roots.push_back(out);
      root_grads.push_back(grad_outputs[k]);
    }
    if (!roots.empty()) {
      torch::AutoGradMode grad_on(true);
      torch::autograd::backward(roots, root_grads);
    }

    // One gradient per forward argument: the state (none), each input, the anchor (none).
    torch::autograd::variable_list grads;
    grads.reserve(saved.size() + 1);
    grads.emplace_back();
    for (const torch::Tensor& leaf : leaves)
      grads.push_back(leaf.requires_grad() ? leaf.grad() : torch::Tensor());
    for (size_t i = num_defined; i < saved.size(); ++i) grads.emplace_back();
    return grads;
  }
};

}  // namespace

std::vector<torch::Tensor> checkpoint(const SegmentFn& fn, const std::vector<torch::Tensor>& inputs,
                                      const CheckpointOptions& options) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);  // nothing would be stored anyway

  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->options = options;
  state->num_inputs = inputs.size();

  // The checkpoint node is only recorded when some input requires grad. A first segment often
  // has inputs that do not (rays, encoded points of a frozen encoder) while its parameters do:
  // an empty leaf that requires grad anchors the node so the parameters still get gradients.
  std::vector<torch::Tensor> args;
  bool any_requires_grad = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    state->defined_inputs.push_back(i);
    args.push_back(inputs[i]);
    any_requires_grad |= inputs[i].requires_grad();
  }
  if (!any_requires_grad) args.push_back(torch::empty({0}, torch::requires_grad()));

  torch::autograd::variable_list defined = CheckpointFunction::apply(state, at::TensorList(args));

  std::vector<torch::Tensor> outputs(state->num_outputs);
  for (size_t k = 0; k < defined.size(); ++k) outputs[state->defined_outputs[k]] = defined[k];
  return outputs;
}

}  // namespace tessera
