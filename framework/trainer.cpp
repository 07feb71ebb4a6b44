// The ray family's construction and step: the rank's slice of the global ray batch, K
// micro-batches with gradient sync on the last, then Adam unless the TrainingRun skips the step.
#include "framework/trainer.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "framework/autocast.h"
#include "framework/fused_adam.h"
#include "framework/learning_check.h"
#include "framework/memory.h"
#include "framework/micro_batch.h"

namespace tessera {

namespace {

torch::Device device_of(Model& model, distributed::Communicator& comm) {
  for (const ParamGroup& g : model.parameter_groups())
    for (const torch::Tensor& p : g.params) return p.device();
  return comm.device();
}

}  // namespace

Trainer::Trainer(distributed::ProcessContext& context, distributed::Communicator& comm,
                 std::unique_ptr<Model> model, const data::SceneReader& scene,
                 TrainerOptions options)
    : Trainer(context, comm, *model, scene, std::move(options)) {
  owned_model_ = std::move(model);
}

Trainer::Trainer(distributed::ProcessContext& context, distributed::Communicator& comm,
                 Model& model, const data::SceneReader& scene, TrainerOptions options)
    : context_(context), comm_(comm), model_(model), scene_(scene), options_(std::move(options)),
      device_(device_of(model, comm)), lr_(options_.lr), sampling_(options_.sampling) {
  check_run_options(options_, device_);
  if (options_.micro_batches < 1) throw UserError("nerf.micro_batches must be >= 1");
  const int64_t per_rank = options_.rays_per_step / comm_.size();
  if (per_rank < options_.micro_batches)
    throw UserError("nerf.rays_per_step (" + std::to_string(options_.rays_per_step) +
                    ") gives fewer rays per rank than nerf.micro_batches (" +
                    std::to_string(options_.micro_batches) + "); raise rays_per_step");
  if (device_.is_cpu()) install_counting_cpu_allocator();  // peak memory per rank
  phases_ = PhaseTimer(device_);

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
}

Trainer::~Trainer() = default;

namespace {

double pixels(const data::SceneReader& scene, const std::vector<size_t>& views) {
  double sum = 0.0;
  for (size_t v : views)
    sum += static_cast<double>(scene.cameras()[v].width) * scene.cameras()[v].height;
  return sum;
}

}  // namespace

EpochSize Trainer::epoch_size() const {
  return {pixels(scene_, scene_.indices(data::Split::Train)),
          static_cast<double>(options_.rays_per_step)};
}

void Trainer::set_total_steps(int64_t steps) {
  options_.steps = steps;
  options_.lr.total_steps = std::max<int64_t>(1, steps);
  options_.lr.warmup_steps = std::min(options_.lr.warmup_steps, options_.lr.total_steps);
  lr_ = LrSchedule(options_.lr);
  options_.sampling.total_steps = std::max<int64_t>(1, steps);
  sampling_ = SamplingSchedule(options_.sampling);
}

double Trainer::eval_cost(const std::vector<size_t>& views) const {
  // A render ray at a training ray's time: without backward, but with every sample of a fully
  // marched ray (measured on a 302x403 capture: 0.58 of a training ray's time). Forecasting
  // less, a run overran its budget by the difference.
  return pixels(scene_, views) / static_cast<double>(options_.rays_per_step);
}

TrainingRun& Trainer::run_driver() {
  if (!run_) run_ = std::make_unique<TrainingRun>(context_, comm_, *this, scene_, options_);
  return *run_;
}

StepResult Trainer::train_step(int64_t step) {
  const StepRecord record = run_driver().train_step(step);
  StepResult result;
  result.step = record.step;
  result.loss = record.loss;
  result.loss_scale = record.loss_scale;
  result.skipped = record.skipped;
  result.seconds = record.seconds;
  result.lr = step_lr_;
  result.sampling_rate = step_rate_;
  result.samples_per_ray = samples_per_ray_;
  result.rendered_per_ray = rendered_per_ray_;
  result.phases = record.phases;
  return result;
}

StepRecord Trainer::forward_backward(const StepControl& control) {
  const int64_t step = control.step;
  phases_.start();
  StepRecord record;
  step_rate_ = sampler_->epoch_of(step).rate;
  step_lr_ = lr_.at(step);
  if (options_.rescale_lr) step_lr_ *= lr_rescale(step_rate_, options_.sampling.rate_max);
  for (auto& group : optimizer_->param_groups())
    static_cast<torch::optim::AdamOptions&>(group.options()).lr(step_lr_);

  const RayBatch batch = sampler_->rank_batch(step, comm_.rank(), comm_.size(), device_);
  const int64_t local = batch.ray_ids.size(0);
  const int64_t k_count = options_.micro_batches;
  const double norm = 3.0 * static_cast<double>(options_.rays_per_step);
  StepContext ctx;
  ctx.step = step;
  ctx.seed = options_.seed;
  ctx.training = true;
  ctx.phases = &phases_;

  optimizer_->zero_grad(/*set_to_none=*/true);
  phases_.lap("sample");
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
      AutocastScope autocast(control.precision, device_);
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
    phases_.lap("loss");
    micro_batch_backward(*sync_, loss, control.loss_scale, /*last=*/k + 1 == k_count);
    phases_.lap("backward");
  }
  sync_->finish();
  phases_.lap("gradient_sync");

  torch::Tensor global_loss = loss_sum.to(comm_.device()).reshape({1});
  comm_.allreduce(global_loss, distributed::ReduceOp::Sum);
  record.loss = global_loss.item<double>();
  record.work = static_cast<double>(options_.rays_per_step);
  samples_per_ray_ = local > 0 ? static_cast<double>(samples) / static_cast<double>(local) : 0.0;
  rendered_per_ray_ = local > 0 ? static_cast<double>(rendered) / static_cast<double>(local) : 0.0;
  const double psnr = record.loss > 0 ? -10.0 * std::log10(record.loss) : 99.0;
  record.fields = {{"psnr", psnr},
                   {"lr", step_lr_},
                   {"sampling_rate", step_rate_},
                   {"samples_per_ray", samples_per_ray_},
                   {"rendered_per_ray", rendered_per_ray_}};
  char progress[128];
  std::snprintf(progress, sizeof(progress), "psnr %.1f spr %.0f/%.0f rate %.2f lr %.1e", psnr,
                rendered_per_ray_, samples_per_ray_, step_rate_, step_lr_);
  record.progress = progress;
  phases_.lap("loss");  // the global loss
  record.phases = phases_.times();
  return record;
}

std::string Trainer::not_learning_causes() const {
  return capture_not_learning_causes(
      "(4) learning rate: nerf.lr too high (loss stuck) or too low; "
      "(5) lens distortion or images at another size than the cameras "
      "(`tessera convert --images-scaled`).");
}

std::string Trainer::overfitting_causes() const {
  return "(4) floaters: density just in front of each camera paints that view and is seen as fog "
         "from the others (nerf.near_gradient_distance, nerf.distortion_weight); "
         "(5) view-dependent color explaining what geometry should (too few views for the "
         "color MLP's directions).";
}

std::vector<torch::Tensor> Trainer::gradients() {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params_) grads.push_back(p.grad());
  return grads;
}

void Trainer::apply_step(const StepControl& control, bool skipped, StepRecord& record) {
  phases_.skip();  // the run's skip check since forward_backward is the run's to charge
  if (!skipped) adam_step(*optimizer_);
  optimizer_->zero_grad(/*set_to_none=*/true);
  phases_.lap("optimizer");
  if (options_.check_agreement) {
    using distributed::check_same_on_all_ranks;
    const std::string at = " at step " + std::to_string(control.step);
    check_same_on_all_ranks(context_, step_lr_, "learning rate" + at);
    check_same_on_all_ranks(context_, step_rate_, "sampling rate" + at);
  }
  StepContext ctx;
  ctx.step = control.step;
  ctx.seed = options_.seed;
  ctx.training = true;
  model_.after_step(ctx, comm_);
  phases_.lap("occupancy");
  record.phases = phases_.times();
}

}  // namespace tessera
