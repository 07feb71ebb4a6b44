// DataParallelFamily: the replicated data-parallel step that families with the same parameters
// on every rank share: the step's learning rate, K micro-batches with bucketed gradient sync on
// the last, the global loss, then Adam unless the TrainingRun skips the step.
#pragma once

#include <torch/optim.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/gradient_synchronizer.h"
#include "distributed/process_context.h"
#include "framework/exact_sum.h"
#include "framework/family.h"
#include "framework/phase_timer.h"
#include "framework/thread_invariance.h"

namespace tessera {

// A family whose parameters are replicated (docs/training_loop.md, "One step"): it supplies the
// loss of each micro-batch of its share of the global batch; forward_backward and apply_step are
// this class's, the same for every such family. Each rank's loss is its share of the global
// mean (its sum over its items divided by the global batch), so that the summed gradients and
// the summed loss are the global mean's whatever the world size.
class DataParallelFamily : public ModelFamily {
 public:
  StepRecord forward_backward(const StepControl& control) final;
  std::vector<torch::Tensor> gradients() final;
  void apply_step(const StepControl& control, bool skipped, StepRecord& record) final;
  MemoryParts memory_parts() override;

  torch::optim::Adam& optimizer() { return *optimizer_; }

  // Test hook: called with each micro-batch's loss before backward (this rank's micro-batch k;
  // on the deterministic path each unit's, with the unit's global index); may replace it.
  std::function<void(int64_t step, int64_t micro_batch, torch::Tensor& loss)> loss_hook;

 protected:
  // What a micro-batch contributes: `loss`, its share of the reported global loss, and `extra`
  // (undefined: none), a term that is backpropagated but not reported (e.g. a regularizer).
  struct MicroBatchLoss {
    torch::Tensor loss;
    torch::Tensor extra;
    // The bitwise path: loss's value, when torch's reduction behind `loss` may split across
    // threads (large CPU tensors) and so depend on their count; a float32 scalar summed in a
    // fixed order (framework/metrics.h ordered_sum). Undefined: loss's own value is used.
    torch::Tensor reported;
  };

  DataParallelFamily(distributed::ProcessContext& process, distributed::Communicator& comm,
                     torch::Device device);
  ~DataParallelFamily() override;

  // Builds Adam over `groups` (one Adam parameter group each, in this order on every rank) and
  // the gradient synchronizer over their tensors. Call once, from the constructor (collective:
  // the synchronizer checks its layout across ranks). `deterministic` (run.deterministic) takes
  // the bitwise path below instead of the synchronizer; it needs work_units() > 0.
  void init_optimizer(const std::vector<std::vector<torch::Tensor>>& groups,
                      const torch::optim::AdamOptions& adam,
                      const distributed::GradientSyncOptions& sync, int64_t micro_batches,
                      bool deterministic = false);

  // ---- The family's part of a step, in call order.
  // Prepares step `step` (e.g. draws this rank's share of the batch) and returns its learning
  // rate, set on every parameter group.
  virtual double begin_step(const StepControl& control) = 0;
  // Micro-batch `k` of `count`, forward under `control.precision`, with autograd. The family
  // charges its own phases on phases() up to its loss.
  virtual MicroBatchLoss micro_batch_loss(const StepControl& control, int64_t k, int64_t count) = 0;
  // ---- Bitwise at any world size (docs/training_loop.md, "Bitwise at any world size"). The
  // step's work is cut into work_units() units fixed by the data and the config, never by the
  // world size; rank r of N runs units even_slice(U, r, N) one after another, each alone (the
  // same shapes on any rank), and every unit's gradients and loss are added into fixed point
  // (framework/exact_sum.h), summed over ranks exactly. 0: the family has no units.
  virtual int64_t work_units() const { return 0; }
  // Unit `unit` of `units`: as micro_batch_loss, its share of the global loss; a function of
  // (step, unit, units) only, never of the rank.
  virtual MicroBatchLoss unit_loss(const StepControl& control, int64_t unit, int64_t units);
  bool deterministic() const { return deterministic_; }
  // The bitwise path on the CPU: torch's ops on one thread while alive (framework/
  // thread_invariance.h), for a family's evals and samples; empty elsewhere. The step's units and
  // after_update are already under it.
  std::optional<TorchOnOneThread> bitwise_threads() const;
  // The world's communicator, for a family's own exact sums (its step metrics).
  distributed::Communicator& world() { return world_; }

  // After the global loss (record.loss): the family's work, fields and progress.
  virtual void end_step(StepRecord& record) = 0;
  // After the optimizer (not called before it): e.g. state agreed across ranks. May lap phases.
  virtual void after_update(const StepControl& control) {}
  // The phase charged with the loss and its allreduce ("loss"; a family may fold it into another).
  virtual const char* loss_phase() const { return "loss"; }

  PhaseTimer& phases() { return phases_; }
  const std::vector<torch::Tensor>& parameters() const { return params_; }

 private:
  distributed::ProcessContext& process_;
  distributed::Communicator& world_;
  torch::Device device_;
  int64_t micro_batches_ = 1;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  std::unique_ptr<distributed::GradientSynchronizer> sync_;  // the float path
  bool deterministic_ = false;
  std::unique_ptr<ExactSum> exact_;  // the bitwise path: each parameter's gradient, then the loss
  PhaseTimer phases_;

  void units_forward_backward(const StepControl& control, torch::Tensor& loss_sum);
};

}  // namespace tessera
