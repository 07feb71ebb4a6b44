// The replicated data-parallel step: micro-batches with bucketed gradient sync on the last, the
// global loss by one allreduce, Adam unless the run skips (docs/training_loop.md, "One step").
#include "framework/data_parallel.h"

#include "framework/adam_state.h"
#include "framework/fused_adam.h"
#include "framework/micro_batch.h"

namespace tessera {

DataParallelFamily::DataParallelFamily(distributed::ProcessContext& process,
                                       distributed::Communicator& comm, torch::Device device)
    : process_(process), world_(comm), device_(device), phases_(device) {}

DataParallelFamily::~DataParallelFamily() = default;

void DataParallelFamily::init_optimizer(const std::vector<std::vector<torch::Tensor>>& groups,
                                        const torch::optim::AdamOptions& adam,
                                        const distributed::GradientSyncOptions& sync,
                                        int64_t micro_batches) {
  std::vector<torch::optim::OptimizerParamGroup> adam_groups;
  for (const std::vector<torch::Tensor>& group : groups) {
    params_.insert(params_.end(), group.begin(), group.end());
    adam_groups.emplace_back(group);
  }
  optimizer_ = std::make_unique<torch::optim::Adam>(adam_groups, adam);
  sync_ = std::make_unique<distributed::GradientSynchronizer>(process_, world_, params_, sync);
  micro_batches_ = micro_batches;
}

StepRecord DataParallelFamily::forward_backward(const StepControl& control) {
  phases_.start();
  const double lr = begin_step(control);
  for (auto& group : optimizer_->param_groups())
    static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
  optimizer_->zero_grad(/*set_to_none=*/true);
  torch::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  for (int64_t k = 0; k < micro_batches_; ++k) {
    MicroBatchLoss micro = micro_batch_loss(control, k, micro_batches_);
    if (loss_hook) loss_hook(control.step, k, micro.loss);
    loss_sum += micro.loss.detach().to(torch::kFloat64);
    const torch::Tensor loss = micro.extra.defined() ? micro.loss + micro.extra : micro.loss;
    phases_.lap(loss_phase());
    micro_batch_backward(*sync_, loss, control.loss_scale, /*last=*/k + 1 == micro_batches_);
    phases_.lap("backward");
  }
  sync_->finish();
  phases_.lap("gradient_sync");
  torch::Tensor global = loss_sum.to(world_.device()).reshape({1});
  world_.allreduce(global, distributed::ReduceOp::Sum);
  StepRecord record;
  record.loss = global.item<double>();
  end_step(record);
  phases_.lap(loss_phase());  // the global loss
  record.phases = phases_.times();
  return record;
}

std::vector<torch::Tensor> DataParallelFamily::gradients() {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params_) grads.push_back(p.grad());
  return grads;
}

void DataParallelFamily::apply_step(const StepControl& control, bool skipped, StepRecord& record) {
  phases_.skip();  // the run's skip check since forward_backward is the run's to charge
  if (!skipped) adam_step(*optimizer_);
  optimizer_->zero_grad(/*set_to_none=*/true);
  phases_.lap("optimizer");
  after_update(control);
  record.phases = phases_.times();
}

MemoryParts DataParallelFamily::memory_parts() { return adam_memory_parts(*optimizer_); }

}  // namespace tessera
