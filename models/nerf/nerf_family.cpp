// The NeRF families (nerf-hash, nerf-mlp): a ray Model trained by the ray family (the RayTrainer),
// its options from the config, and activation checkpointing applied from [checkpoint].
#include "models/nerf/nerf_family.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>

#include "distributed/errors.h"
#include "framework/checkpoint_policy.h"
#include "models/nerf/ray_trainer.h"
#include "models/nerf/nerf_config.h"
#include "models/nerf/nerf_hash.h"
#include "models/nerf/nerf_mlp.h"

namespace tessera::models::nerf {

namespace {

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

// Applies [checkpoint] to the model and logs the plan on every rank (each rank logs to its own
// file). "budget" measures the segments on this rank's first micro-batch of step 0 (the
// RayTrainer's own RaySampler, so the same rays and ray count a micro-batch of training renders)
// with Model::measure_segments, and plans per rank on those measurements. Checkpointing never
// changes values, so ranks whose plans differ (micro-batches differ by one ray) still agree.
void apply_checkpoint_policy(const Config& config, Model& model, RayTrainer& trainer,
                             distributed::Communicator& comm, torch::Device device) {
  CheckpointPolicyOptions options;
  options.segments = split_names(config.checkpoint.segments);
  options.every = config.checkpoint.every;
  options.budget_mib = config.checkpoint.budget_mib;
  const auto policy = make_checkpoint_policy(config.checkpoint.policy, options);
  std::vector<SegmentInfo> segments;
  if (config.checkpoint.policy == "budget") {
    const RayBatch batch = trainer.sampler().rank_batch(0, comm.rank(), comm.size(), device);
    const int64_t micro = batch.ray_ids.size(0) / std::max<int64_t>(trainer.options().nerf.micro_batches, 1);
    RayBatch rays = batch;
    rays.origins = batch.origins.narrow(0, 0, micro);
    rays.directions = batch.directions.narrow(0, 0, micro);
    rays.near = batch.near.narrow(0, 0, micro);
    rays.far = batch.far.narrow(0, 0, micro);
    rays.target_rgb = batch.target_rgb.narrow(0, 0, micro);
    rays.ray_ids = batch.ray_ids.narrow(0, 0, micro);
    StepContext context;
    context.step = 0;
    context.seed = static_cast<uint64_t>(config.run.seed);
    context.training = true;
    segments = model.measure_segments(rays, context);
    if (segments.size() != model.segment_names().size())
      throw UserError(config.source_path + ": checkpoint.policy = \"budget\" needs per-segment "
                      "memory measurements, which model '" + model.name() +
                      "' does not provide; use \"segments\" or \"none\"");
    spdlog::info("checkpoint budget: segments measured on {} rays (first micro-batch of step 0)",
                 micro);
  } else {
    for (const std::string& name : model.segment_names()) segments.push_back({name, 0, 0});
  }
  const CheckpointPlan plan = policy->plan(segments);
  std::vector<std::string> chosen;
  for (size_t i = 0; i < segments.size(); ++i)
    if (plan.is_checkpointed(i)) chosen.push_back(segments[i].name);
  model.set_checkpointed_segments(chosen);
  spdlog::info("activation checkpointing ({}): {} of {} segments recomputed{}",
               config.checkpoint.policy, chosen.size(), segments.size(),
               config.checkpoint.policy == "none" ? "" : "\n" + plan.text);
  if (!plan.fits) spdlog::warn("activation checkpointing: the budget cannot be met (see the plan)");
}

using ModelMaker = std::unique_ptr<Model> (*)(const Config&, const ModelContext&);

FamilyInfo nerf_family(const std::string& name, ModelMaker make) {
  FamilyInfo info;
  info.name = name;
  info.create = [make](const FamilyContext& c) -> std::unique_ptr<ModelFamily> {
    std::unique_ptr<Model> model = make(c.config, ModelContext::from_scene(c.scene(), c.device));
    Model& raw = *model;
    auto trainer = std::make_unique<RayTrainer>(c.process, c.comm, std::move(model), c.scene(),
                                             trainer_options(c.config));
    apply_checkpoint_policy(c.config, raw, *trainer, c.comm, c.device);
    return trainer;
  };
  info.check_config = [](const Config& config) {
    check_nerf_config(config.section<NerfConfig>(), config.source_path);
    // The schedules check their own combinations (e.g. rate_min <= rate_max) when built.
    const RayTrainerOptions o = trainer_options(config);
    LrSchedule{lr_schedule_options(o.nerf, o.steps)};
    SamplingSchedule{o.sampling};
  };
  info.config_sections = {nerf_config_section()};
  // The ray sampling schedule, checkpointing by segments and the gradient buckets: every
  // opt-in framework key.
  info.shared_keys = {"sampling", "checkpoint", "distributed.first_bucket_mib",
                      "distributed.bucket_mib"};
  // Checkpointing by the model's segments (docs/checkpointing.md).
  info.key_choices = {{"checkpoint.policy", {"none", "segments", "budget"}}};
  return info;
}

}  // namespace

RayTrainerOptions trainer_options(const Config& config) {
  RayTrainerOptions o;
  static_cast<RunOptions&>(o) = run_options(config);
  o.nerf = config.section<NerfConfig>();
  o.sampling = sampling_options(config);
  o.rescale_lr = config.sampling.rescale_lr;
  constexpr double kMiB = 1024.0 * 1024.0;
  o.grad_sync.first_bucket_bytes = static_cast<int64_t>(config.distributed.first_bucket_mib * kMiB);
  o.grad_sync.bucket_bytes = static_cast<int64_t>(config.distributed.bucket_mib * kMiB);
  return o;
}

void register_nerf_models(ModelRegistry& registry) {
  registry.add("nerf-hash", make_nerf_hash);
  registry.add("nerf-mlp", make_nerf_mlp);
}

void register_nerf_families(FamilyRegistry& registry) {
  registry.add(nerf_family("nerf-hash", make_nerf_hash));
  registry.add(nerf_family("nerf-mlp", make_nerf_mlp));
}

}  // namespace tessera::models::nerf
