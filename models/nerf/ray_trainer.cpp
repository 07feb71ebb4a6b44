// The ray family's construction and its part of the data-parallel step: the rank's slice of the
// global ray batch, rendered in K micro-batches; the occupancy update after Adam.
#include "models/nerf/ray_trainer.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "framework/autocast.h"
#include "framework/learning_check.h"
#include "framework/memory.h"
#include "framework/metrics.h"

namespace tessera::models::nerf {

namespace {

torch::Device device_of(Model& model, distributed::Communicator& comm) {
  for (const ParamGroup& g : model.parameter_groups())
    for (const torch::Tensor& p : g.params) return p.device();
  return comm.device();
}

}  // namespace

RayTrainer::RayTrainer(distributed::ProcessContext& context, distributed::Communicator& comm,
                 std::unique_ptr<Model> model, const data::SceneReader& scene,
                 RayTrainerOptions options)
    : RayTrainer(context, comm, *model, scene, std::move(options)) {
  owned_model_ = std::move(model);
}

RayTrainer::RayTrainer(distributed::ProcessContext& context, distributed::Communicator& comm,
                       Model& model, const data::SceneReader& scene, RayTrainerOptions options)
    : DataParallelFamily(context, comm, device_of(model, comm)), context_(context), comm_(comm),
      model_(model), scene_(scene), options_(std::move(options)), device_(device_of(model, comm)),
      lr_options_(lr_schedule_options(options_.nerf, options_.steps)), lr_(lr_options_),
      sampling_(options_.sampling) {
  check_run_options(options_, device_);
  if (options_.nerf.micro_batches < 1) throw UserError("nerf.micro_batches must be >= 1");
  const int64_t per_rank = options_.nerf.rays_per_step / comm_.size();
  if (!options_.deterministic && per_rank < options_.nerf.micro_batches)
    throw UserError("nerf.rays_per_step (" + std::to_string(options_.nerf.rays_per_step) +
                    ") gives fewer rays per rank than nerf.micro_batches (" +
                    std::to_string(options_.nerf.micro_batches) + "); raise rays_per_step");
  if (device_.is_cpu()) install_counting_cpu_allocator();  // peak memory per rank
  model_.set_total_steps(options_.steps);

  std::vector<std::vector<torch::Tensor>> groups;
  for (const ParamGroup& g : model_.parameter_groups()) groups.push_back(g.params);
  init_optimizer(groups,
                 torch::optim::AdamOptions(options_.nerf.lr)
                     .betas({options_.adam_beta1, options_.adam_beta2})
                     .eps(options_.nerf.adam_eps),
                 options_.grad_sync, options_.nerf.micro_batches, options_.deterministic);
  RaySamplerOptions so;
  so.rays_per_step = options_.nerf.rays_per_step;
  so.seed = options_.seed;
  so.random_background = options_.nerf.background == "random";
  so.pixel_jitter = options_.nerf.pixel_jitter;
  sampler_ = std::make_unique<RaySampler>(
      scene_, so, [this](int64_t step) { return sampling_.at(step); });
}

RayTrainer::~RayTrainer() = default;

namespace {

double pixels(const data::SceneReader& scene, const std::vector<size_t>& views) {
  double sum = 0.0;
  for (size_t v : views)
    sum += static_cast<double>(scene.cameras()[v].width) * scene.cameras()[v].height;
  return sum;
}

}  // namespace

EpochSize RayTrainer::epoch_size() const {
  return {pixels(scene_, scene_.indices(data::Split::Train)),
          static_cast<double>(options_.nerf.rays_per_step)};
}

void RayTrainer::set_total_steps(int64_t steps) {
  options_.steps = steps;
  lr_options_.total_steps = std::max<int64_t>(1, steps);
  lr_options_.warmup_steps = std::min(lr_options_.warmup_steps, lr_options_.total_steps);
  lr_ = LrSchedule(lr_options_);
  options_.sampling.total_steps = std::max<int64_t>(1, steps);
  sampling_ = SamplingSchedule(options_.sampling);
  model_.set_total_steps(steps);
}

double RayTrainer::eval_cost(const std::vector<size_t>& views) const {
  // A render ray at a training ray's time: without backward, but with every sample of a fully
  // marched ray (measured on a 302x403 capture: 0.58 of a training ray's time). Forecasting
  // less, a run overran its budget by the difference.
  return pixels(scene_, views) / static_cast<double>(options_.nerf.rays_per_step);
}

TrainingRun& RayTrainer::run_driver() {
  if (!run_) run_ = std::make_unique<TrainingRun>(context_, comm_, *this, scene_, options_);
  return *run_;
}

double RayTrainer::begin_step(const StepControl& control) {
  step_rate_ = sampler_->epoch_of(control.step).rate;
  step_lr_ = lr_.at(control.step);
  if (options_.rescale_lr) step_lr_ *= lr_rescale(step_rate_, options_.sampling.rate_max);
  if (!deterministic())  // the bitwise path builds each unit's rays in unit_loss
    batch_ = sampler_->rank_batch(control.step, comm_.rank(), comm_.size(), device_);
  samples_ = rendered_ = 0;
  phases().lap("sample");
  return step_lr_;
}

DataParallelFamily::MicroBatchLoss RayTrainer::micro_batch_loss(const StepControl& control,
                                                                int64_t k, int64_t count) {
  const int64_t local = batch_.ray_ids.size(0);
  const int64_t begin = local * k / count, end = local * (k + 1) / count;
  return rays_loss(control, narrow_rays(batch_, begin, end - begin));
}

int64_t RayTrainer::work_units() const {
  const int64_t rays = options_.nerf.rays_per_step;
  const int64_t unit = options_.nerf.unit_rays > 0 ? options_.nerf.unit_rays
                                                   : std::max<int64_t>(256, rays / 16);
  return (rays + unit - 1) / unit;
}

DataParallelFamily::MicroBatchLoss RayTrainer::unit_loss(const StepControl& control,
                                                         int64_t unit, int64_t units) {
  const RayBatch rays = sampler_->rank_batch(control.step, static_cast<int>(unit),
                                             static_cast<int>(units), device_);
  phases().lap("sample");
  return rays_loss(control, rays);
}

DataParallelFamily::MicroBatchLoss RayTrainer::rays_loss(const StepControl& control,
                                                         const RayBatch& micro) {
  StepContext ctx;
  ctx.step = control.step;
  ctx.seed = options_.seed;
  ctx.training = true;
  ctx.phases = &phases();
  MicroBatchLoss loss;
  torch::Tensor sq;
  {
    AutocastScope autocast(control.precision, device_);
    const RenderResult out = model_.render(micro, ctx);
    samples_ += out.samples;
    rendered_ += out.samples_rendered >= 0 ? out.samples_rendered : out.samples;
    const torch::Tensor squared = (out.rgb.to(torch::kFloat32) - micro.target_rgb).pow(2);
    sq = squared.sum();
    if (deterministic() && device_.is_cpu())  // the value at any thread count
      loss.reported = torch::tensor(static_cast<float>(
          ordered_sum(squared) / (3.0 * static_cast<double>(options_.nerf.rays_per_step))));
    if (out.regularization.defined())
      loss.extra = out.regularization.to(torch::kFloat32) /
                   static_cast<double>(options_.nerf.rays_per_step);
  }
  // The global mean squared error over the step's rays and channels: this rank's share.
  loss.loss = sq / (3.0 * static_cast<double>(options_.nerf.rays_per_step));
  return loss;
}

void RayTrainer::end_step(StepRecord& record) {
  // Samples over the step's rays on every rank (integers: exact in any order).
  torch::Tensor counts =
      torch::tensor({samples_, rendered_}, torch::kInt64).to(comm_.device());
  comm_.allreduce(counts, distributed::ReduceOp::Sum);
  counts = counts.cpu();
  const double rays = static_cast<double>(options_.nerf.rays_per_step);
  const double samples_per_ray = counts[0].item<double>() / rays;
  const double rendered_per_ray = counts[1].item<double>() / rays;
  record.work = static_cast<double>(options_.nerf.rays_per_step);
  const double psnr = record.loss > 0 ? -10.0 * std::log10(record.loss) : 99.0;
  record.fields = {{"psnr", psnr},
                   {"lr", step_lr_},
                   {"sampling_rate", step_rate_},
                   {"samples_per_ray", samples_per_ray},
                   {"rendered_per_ray", rendered_per_ray}};
  char progress[128];
  std::snprintf(progress, sizeof(progress), "psnr %.1f spr %.0f/%.0f rate %.2f lr %.1e", psnr,
                rendered_per_ray, samples_per_ray, step_rate_, step_lr_);
  record.progress = progress;
  batch_ = RayBatch{};  // the rays are not needed until the next step
}

std::string RayTrainer::not_learning_causes() const {
  return capture_not_learning_causes(
      "(4) learning rate: nerf.lr too high (loss stuck) or too low; "
      "(5) lens distortion or images at another size than the cameras "
      "(`tessera convert --images-scaled`).");
}

std::string RayTrainer::overfitting_causes() const {
  return "(4) floaters: density just in front of each camera paints that view and is seen as fog "
         "from the others (nerf.near_gradient_distance, nerf.distortion_weight); "
         "(5) a hash grid finer than the photos, whose fine cells each training ray fits on its "
         "own (nerf.hash_max_resolution = 0 sizes it from the images; nerf.hash_coarse_to_fine; "
         "nerf.hash_weight_decay; a smaller nerf.hash_log2_size); "
         "(6) view-dependent color explaining what geometry should (too few views for the "
         "color MLP's directions).";
}

void RayTrainer::after_update(const StepControl& control) {
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
  phases().lap("occupancy");
}

}  // namespace tessera::models::nerf
