// Trainer options from a config, and a run restored from a snapshot (launch/run_setup.h).
#include "launch/run_setup.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "distributed/errors.h"
#include "framework/log.h"
#include "framework/snapshot.h"
#include "launch/train_gaussians.h"
#include "models/builtin.h"

namespace tessera::launch {

SamplingScheduleOptions sampling_options(const Config& config) {
  SamplingScheduleOptions o;
  o.name = config.sampling.schedule;
  o.rate_max = config.sampling.rate_max;
  o.rate_min = config.sampling.rate_min;
  o.total_steps = config.train.steps;
  o.step_every = config.sampling.step_every;
  o.step_factor = config.sampling.step_factor;
  return o;
}

TrainerOptions trainer_options(const Config& config) {
  TrainerOptions o;
  o.steps = config.train.steps;
  o.rays_per_step = config.train.rays_per_step;
  o.micro_batches = config.train.micro_batches;
  o.seed = static_cast<uint64_t>(config.run.seed);
  o.lr.name = config.train.lr_schedule;
  o.lr.lr = config.train.lr;
  o.lr.final_lr = config.train.final_lr;
  o.lr.total_steps = config.train.steps;
  o.lr.warmup_steps = config.train.warmup_steps;
  o.sampling = sampling_options(config);
  o.rescale_lr = config.sampling.rescale_lr;
  o.precision = config.train.precision;
  o.log_every = config.train.log_every;
  o.eval_every = config.eval.every;
  o.eval_split = config.eval.split;
  o.eval_max_views = config.eval.max_views;
  o.out_dir = config.run.out_dir;
  o.check_agreement = config.distributed.check_agreement;
  o.adam_eps = config.train.adam_eps;
  o.max_skipped_steps = config.train.max_skipped_steps;
  o.random_background = config.train.background == "random";
  o.not_learning_steps = config.train.check_learning_after;
  o.snapshot_every = config.snapshot.every;
  o.snapshot_keep = config.snapshot.keep;
  o.snapshot_parallel = config.snapshot.parallel;
  constexpr double kMiB = 1024.0 * 1024.0;
  o.grad_sync.first_bucket_bytes = static_cast<int64_t>(config.distributed.first_bucket_mib * kMiB);
  o.grad_sync.bucket_bytes = static_cast<int64_t>(config.distributed.bucket_mib * kMiB);
  return o;
}

RestoredRun restore_run(const std::string& snapshot, const std::vector<std::string>& overrides) {
  // The reader checks the format here; load_snapshot verifies every checksum as it reads.
  RestoredRun run;
  {
    const SnapshotReader reader(snapshot);
    run.step = reader.meta().step;
    run.config = parse_config(reader.meta().config_toml, snapshot + " (stored config)", overrides);
  }
  const bool gaussians = run.config.model.name == kGaussiansModel;
  ModelRegistry registry;
  models::register_builtin_models(registry);
  if (!gaussians) registry.require(run.config.model.name, snapshot);
  if (run.config.data.path.empty() || !std::filesystem::exists(run.config.data.path))
    throw UserError(snapshot + ": its dataset '" + run.config.data.path + "' is not there; pass "
                    "--set data.path=FILE to point at it");
  run.scene = std::make_unique<data::SceneReader>(run.config.data.path);

  run.context = std::make_unique<distributed::ProcessContext>(nullptr, nullptr,
                                                              run.config.distributed.timeout_s);
  log::init({run.context->rank(), "warn", "", true});
  run.context->apply_thread_share(static_cast<int>(run.config.distributed.threads));
  const torch::Device device = run.context->one_cuda_device_per_rank()
                                   ? torch::Device(torch::kCUDA, run.context->cuda_device_index())
                                   : torch::Device(torch::kCPU);
  run.comm = distributed::make_communicator(*run.context, run.config.distributed.backend, device);
  if (gaussians) {
    run.gaussians = std::make_unique<models::gaussians::GaussianTrainer>(
        *run.comm, *run.scene, gaussian_trainer_options(run.config));
    run.gaussians->load_snapshot(snapshot);
    return run;
  }
  run.model = registry.create(run.config, ModelContext::from_scene(*run.scene, device));
  TrainerOptions options = trainer_options(run.config);
  options.out_dir = "";      // eval and render write only what they are asked to
  options.progress = false;
  run.trainer = std::make_unique<Trainer>(*run.context, *run.comm, *run.model, *run.scene, options);
  run.trainer->load_snapshot(snapshot);
  return run;
}

}  // namespace tessera::launch
