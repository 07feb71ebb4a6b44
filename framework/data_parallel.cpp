// The replicated data-parallel step: micro-batches with bucketed gradient sync on the last, the
// global loss by one allreduce, Adam unless the run skips (docs/training_loop.md, "One step").
#include "framework/data_parallel.h"

#include <spdlog/spdlog.h>

#include <cstdlib>

#include "distributed/errors.h"
#include "framework/adam_state.h"
#include "framework/even_slice.h"
#include "framework/fused_adam.h"
#include "framework/micro_batch.h"
#include "framework/thread_invariance.h"

namespace tessera {

DataParallelFamily::DataParallelFamily(distributed::ProcessContext& process,
                                       distributed::Communicator& comm, torch::Device device)
    : process_(process), world_(comm), device_(device), phases_(device) {}

DataParallelFamily::~DataParallelFamily() = default;

void DataParallelFamily::init_optimizer(const std::vector<std::vector<torch::Tensor>>& groups,
                                        const torch::optim::AdamOptions& adam,
                                        const distributed::GradientSyncOptions& sync,
                                        int64_t micro_batches, bool deterministic) {
  std::vector<torch::optim::OptimizerParamGroup> adam_groups;
  for (const std::vector<torch::Tensor>& group : groups) {
    params_.insert(params_.end(), group.begin(), group.end());
    adam_groups.emplace_back(group);
  }
  optimizer_ = std::make_unique<torch::optim::Adam>(adam_groups, adam);
  micro_batches_ = micro_batches;
  deterministic_ = deterministic;
  if (!deterministic_) {
    sync_ = std::make_unique<distributed::GradientSynchronizer>(process_, world_, params_, sync);
    return;
  }
  const int64_t units = work_units();
  if (units < 1) throw UserError("run.deterministic: this model has no work units");
  if (device_.type() != world_.device().type())
    throw UserError("run.deterministic: the model is on " + device_.str() +
                    " but the communicator reduces on " + world_.device().str());
  if (units < world_.size() && world_.rank() == 0)
    spdlog::warn("run.deterministic: a step has {} work unit(s) for {} ranks, so {} rank(s) wait "
                 "idle; smaller units (the model section's unit_* key) or a larger batch "
                 "keep every rank busy (a unit's size changes the run's bits, the world size "
                 "does not)",
                 units, world_.size(), world_.size() - units);
  if (device_.is_cpu() && world_.rank() == 0 && blas_mode() == BlasMode::NotReproducible)
    spdlog::warn("run.deterministic: oneMKL runs without a reproducible mode (MKL_CBWR={}), so a "
                 "GEMM's bits may depend on where its operands lie in memory, which differs "
                 "between ranks; unset MKL_CBWR (tessera then sets {})",
                 std::getenv("MKL_CBWR") != nullptr ? std::getenv("MKL_CBWR") : "unset",
                 kMklReproducibleMode);
  std::vector<std::vector<int64_t>> shapes;
  for (const torch::Tensor& p : params_) {
    if (p.scalar_type() != torch::kFloat32)
      throw UserError("run.deterministic needs float32 parameters (got " +
                      std::string(c10::toString(p.scalar_type())) + ")");
    shapes.push_back(p.sizes().vec());
  }
  shapes.push_back({});  // the loss
  exact_ = std::make_unique<ExactSum>(shapes, device_);
}

DataParallelFamily::MicroBatchLoss DataParallelFamily::unit_loss(const StepControl&, int64_t,
                                                                 int64_t) {
  throw UserError("run.deterministic: this model has no work units");
}

std::optional<TorchOnOneThread> DataParallelFamily::bitwise_threads() const {
  return torch_on_one_thread_if(deterministic_, device_);
}

void DataParallelFamily::units_forward_backward(const StepControl& control,
                                                torch::Tensor& loss_sum) {
  const auto threads = bitwise_threads();
  const int64_t units = work_units();
  const auto [first, last] = even_slice(units, world_.rank(), world_.size());
  exact_->clear();
  const size_t loss_slot = params_.size();
  for (int64_t u = first; u < last; ++u) {
    MicroBatchLoss micro = unit_loss(control, u, units);
    if (loss_hook) loss_hook(control.step, u, micro.loss);
    const torch::Tensor& value = micro.reported.defined() ? micro.reported : micro.loss;
    exact_->add(loss_slot, value.detach().to(torch::kFloat32).reshape({}));
    torch::Tensor loss = micro.extra.defined() ? micro.loss + micro.extra : micro.loss;
    if (control.loss_scale != 1.0) loss = loss * control.loss_scale;
    phases_.lap(loss_phase());
    loss.backward();
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& grad = params_[i].mutable_grad();
      if (!grad.defined()) continue;
      exact_->add(i, grad);
      grad.zero_();
    }
    phases_.lap("backward");
  }
  exact_->allreduce(world_);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = exact_->value(i);
  phases_.lap("gradient_sync");
  loss_sum = exact_->value(loss_slot, torch::kFloat64);
}

StepRecord DataParallelFamily::forward_backward(const StepControl& control) {
  phases_.start();
  const double lr = begin_step(control);
  for (auto& group : optimizer_->param_groups())
    static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
  optimizer_->zero_grad(/*set_to_none=*/true);
  torch::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  StepRecord record;
  if (deterministic_) {
    units_forward_backward(control, loss_sum);  // already the sum over ranks
    record.loss = loss_sum.item<double>();
    end_step(record);
    phases_.lap(loss_phase());
    record.phases = phases_.times();
    return record;
  }
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
  const auto threads = bitwise_threads();
  after_update(control);
  record.phases = phases_.times();
}

MemoryParts DataParallelFamily::memory_parts() { return adam_memory_parts(*optimizer_); }

}  // namespace tessera
