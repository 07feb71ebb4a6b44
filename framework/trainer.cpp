// Trainer construction and one optimizer step: the rank's slice of the global ray batch, K
// micro-batches with gradient sync on the last, agreed skip-step, Adam (docs/training_loop.md).
#include "framework/trainer.h"

#include <ATen/autocast_mode.h>

#include <cmath>
#include <filesystem>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "framework/autocast.h"
#include "framework/memory.h"

namespace tessera {

namespace {


torch::Device device_of(Model& model, distributed::Communicator& comm) {
  for (const ParamGroup& g : model.parameter_groups())
    for (const torch::Tensor& p : g.params) return p.device();
  return comm.device();
}

}  // namespace

Trainer::Trainer(distributed::ProcessContext& context, distributed::Communicator& comm,
                 Model& model, const data::SceneReader& scene, TrainerOptions options)
    : context_(context), comm_(comm), model_(model), scene_(scene), options_(std::move(options)),
      device_(device_of(model, comm)), lr_(options_.lr), sampling_(options_.sampling) {
  const std::string& p = options_.precision;
  if (p != "fp32" && p != "bf16" && p != "fp16")
    throw UserError("train.precision must be one of fp32, bf16, fp16 (got \"" + p + "\")");
  if (p != "fp32" && !device_.is_cuda())
    throw UserError("train.precision = \"" + p + "\" needs a CUDA device; this run is on the " +
                    "CPU. Use precision = \"fp32\".");
  if (options_.steps < 0) throw UserError("train.steps must be >= 0");
  if (options_.micro_batches < 1) throw UserError("train.micro_batches must be >= 1");
  const int64_t per_rank = options_.rays_per_step / comm_.size();
  if (per_rank < options_.micro_batches)
    throw UserError("train.rays_per_step (" + std::to_string(options_.rays_per_step) +
                    ") gives fewer rays per rank than train.micro_batches (" +
                    std::to_string(options_.micro_batches) + "); raise rays_per_step");
  if (options_.eval_split != "train" && options_.eval_split != "val" &&
      options_.eval_split != "test")
    throw UserError("eval.split must be train, val or test (got \"" + options_.eval_split + "\")");
  options_.loss_scaler.enabled = (p == "fp16");
  scaler_ = std::make_unique<LossScaler>(options_.loss_scaler);

  if (device_.is_cpu()) install_counting_cpu_allocator();

  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const ParamGroup& g : model_.parameter_groups()) {
    for (const torch::Tensor& t : g.params) params_.push_back(t);
    groups.emplace_back(g.params);
  }
  auto adam = torch::optim::AdamOptions(options_.lr.lr)
                  .betas({options_.adam_beta1, options_.adam_beta2})
                  .eps(options_.adam_eps);
  optimizer_ = std::make_unique<torch::optim::Adam>(groups, adam);
  sync_ = std::make_unique<distributed::GradientSynchronizer>(context_, comm_, params_,
                                                              options_.grad_sync);
  RaySamplerOptions so;
  so.rays_per_step = options_.rays_per_step;
  so.seed = options_.seed;
  so.random_background = options_.random_background;
  sampler_ = std::make_unique<RaySampler>(
      scene_, so, [this](int64_t step) { return sampling_.at(step); });

  if (!options_.out_dir.empty() && comm_.rank() == 0) {
    std::filesystem::create_directories(std::filesystem::path(options_.out_dir) / "renders");
    const std::string path = (std::filesystem::path(options_.out_dir) / "metrics.jsonl").string();
    // Opened here so that an unwritable run directory fails before training; run() reopens
    // it to keep a resumed run's earlier records (trainer_output.cpp).
    std::ofstream probe(path, std::ios::app);
    if (!probe) throw UserError("cannot open " + path + " for writing; check run.out_dir");
  }
  start_ = std::chrono::steady_clock::now();
}

Trainer::~Trainer() = default;

StepResult Trainer::train_step(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  StepResult result;
  result.step = step;
  result.sampling_rate = sampler_->epoch_of(step).rate;
  result.lr = lr_.at(step);
  if (options_.rescale_lr)
    result.lr *= lr_rescale(result.sampling_rate, options_.sampling.rate_max);
  result.loss_scale = scaler_->scale();
  for (auto& group : optimizer_->param_groups())
    static_cast<torch::optim::AdamOptions&>(group.options()).lr(result.lr);

  const RayBatch batch = sampler_->rank_batch(step, comm_.rank(), comm_.size(), device_);
  const int64_t local = batch.ray_ids.size(0);
  const int64_t k_count = options_.micro_batches;
  const double norm = 3.0 * static_cast<double>(options_.rays_per_step);
  StepContext ctx;
  ctx.step = step;
  ctx.seed = options_.seed;
  ctx.training = true;

  optimizer_->zero_grad(/*set_to_none=*/true);
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  int64_t samples = 0, rendered = 0;
  for (int64_t k = 0; k < k_count; ++k) {
    const int64_t begin = local * k / k_count, end = local * (k + 1) / k_count;
    RayBatch micro;
    micro.origins = batch.origins.narrow(0, begin, end - begin);
    micro.directions = batch.directions.narrow(0, begin, end - begin);
    micro.near = batch.near.narrow(0, begin, end - begin);
    micro.far = batch.far.narrow(0, begin, end - begin);
    micro.target_rgb = batch.target_rgb.narrow(0, begin, end - begin);
    micro.background = batch.background.dim() == 2 ? batch.background.narrow(0, begin, end - begin)
                                                   : batch.background;
    micro.ray_ids = batch.ray_ids.narrow(0, begin, end - begin);
    torch::Tensor sq, regularization;
    {
      AutocastScope autocast(options_.precision, device_);
      const RenderResult out = model_.render(micro, ctx);
      samples += out.samples;
      rendered += out.samples_rendered >= 0 ? out.samples_rendered : out.samples;
      sq = (out.rgb.to(torch::kFloat32) - micro.target_rgb).pow(2).sum();
      if (out.regularization.defined())
        regularization = out.regularization.to(torch::kFloat32) /
                         static_cast<double>(options_.rays_per_step);
    }
    torch::Tensor loss = sq / norm;
    if (loss_hook) loss_hook(step, k, loss);
    loss_sum += loss.detach().to(torch::kFloat64);
    if (regularization.defined()) loss = loss + regularization;
    const torch::Tensor scaled = scaler_->scale_loss(loss);
    if (k + 1 < k_count) {
      distributed::NoSyncScope no_sync(*sync_);
      scaled.backward();
    } else {
      scaled.backward();
    }
  }
  sync_->finish();

  // Skip decision: local count of non-finite gradients, agreed by a max over all ranks.
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params_) grads.push_back(p.grad());
  torch::Tensor found = torch::tensor(
      {static_cast<int64_t>(scaler_->unscale_and_count_nonfinite(grads) > 0 ? 1 : 0)},
      torch::TensorOptions().dtype(torch::kInt64).device(comm_.device()));
  comm_.allreduce(found, distributed::ReduceOp::Max);
  result.skipped = scaler_->update(found.item<int64_t>() != 0);
  if (!result.skipped) optimizer_->step();
  consecutive_skips_ = result.skipped ? consecutive_skips_ + 1 : 0;
  optimizer_->zero_grad(/*set_to_none=*/true);

  torch::Tensor global_loss = loss_sum.to(comm_.device()).reshape({1});
  comm_.allreduce(global_loss, distributed::ReduceOp::Sum);
  result.loss = global_loss.item<double>();

  if (options_.check_agreement) {
    using distributed::check_same_on_all_ranks;
    check_same_on_all_ranks(context_, result.lr, "learning rate at step " + std::to_string(step));
    check_same_on_all_ranks(context_, result.sampling_rate,
                            "sampling rate at step " + std::to_string(step));
    check_same_on_all_ranks(context_, result.loss_scale, "loss scale at step " + std::to_string(step));
    check_same_on_all_ranks(context_, static_cast<uint64_t>(result.skipped),
                            "skip-step decision at step " + std::to_string(step));
  }
  model_.after_step(ctx, comm_);
  ++steps_done_;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.samples_per_ray = local > 0 ? static_cast<double>(samples) / static_cast<double>(local) : 0.0;
  result.rendered_per_ray = local > 0 ? static_cast<double>(rendered) / static_cast<double>(local) : 0.0;
  return result;
}

}  // namespace tessera
