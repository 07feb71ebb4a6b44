// `tessera train CONFIG`: loads and validates the config (before MPI starts, so bad input is
// reported once), prints it on request, then sets up ranks, logging, dataset, model and Trainer.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/checkpoint_policy.h"
#include "framework/config.h"
#include "framework/data/scene.h"
#include "framework/log.h"
#include "framework/model.h"
#include "framework/snapshot.h"
#include "framework/trainer.h"
#include "framework/trainer_run.h"
#include "launch/commands.h"
#include "launch/run_setup.h"
#include "launch/train_gaussians.h"
#include "models/builtin.h"

namespace tessera::launch {

namespace {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string log_level;
  bool print_config = false;
  std::string resume;      // "", "auto" or a snapshot path
  int64_t until = -1;      // stop after this step (snapshot written); -1 = train.steps
};

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
// Trainer's own RaySampler, so the same rays and ray count a micro-batch of training renders)
// with Model::measure_segments, and plans per rank on those measurements. Checkpointing never
// changes values, so ranks whose plans differ (micro-batches differ by one ray) still agree.
void apply_checkpoint_policy(const Config& config, Model& model, Trainer& trainer,
                             distributed::Communicator& comm, torch::Device device) {
  CheckpointPolicyOptions options;
  options.segments = split_names(config.checkpoint.segments);
  options.every = config.checkpoint.every;
  options.budget_mib = config.checkpoint.budget_mib;
  const auto policy = make_checkpoint_policy(config.checkpoint.policy, options);
  std::vector<SegmentInfo> segments;
  if (config.checkpoint.policy == "budget") {
    const RayBatch batch = trainer.sampler().rank_batch(0, comm.rank(), comm.size(), device);
    const int64_t micro = batch.ray_ids.size(0) / std::max<int64_t>(trainer.options().micro_batches, 1);
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

// The snapshot a run resumes from: `resume` itself, or for "auto" the newest snapshot in
// `snapshot_dir` that validates (damaged newer ones skipped with a warning); "" = start at step
// 0. Every rank looks; they must pick the same file (checked). Shared by NeRF and 3DGS runs.
std::string resolve_resume(const std::string& resume, const std::string& snapshot_dir,
                           distributed::ProcessContext& context) {
  if (resume != "auto") return resume;
  const auto found = find_latest_snapshot(snapshot_dir, [&](const std::string& message) {
    spdlog::warn("--resume auto: skipping {}", message);
    if (context.rank() == 0) std::cerr << "warning: --resume auto: skipping " << message << "\n";
  });
  const std::string path = found.value_or("");
  if (path.empty()) {
    spdlog::info("--resume auto: no snapshot in {}; starting at step 0", snapshot_dir);
    if (context.rank() == 0)
      std::cerr << "--resume auto: no snapshot in " << snapshot_dir << "; starting at step 0\n";
  }
  distributed::check_same_on_all_ranks(context, distributed::fingerprint(path),
                                       "the snapshot chosen by --resume auto (is " + snapshot_dir +
                                       " on a filesystem all ranks share?)");
  return path;
}

int run_train(const TrainOptions& options) {
  std::vector<std::string> overrides = options.overrides;
  if (!options.log_level.empty()) overrides.push_back("run.log_level=" + options.log_level);
  const Config config = load_config(options.config_path, overrides);
  const std::string resolved = to_toml(config);
  if (options.print_config) {
    if (launcher_rank() == 0) std::cout << resolved << std::flush;
    return kExitOk;
  }
  // Everything that can be checked without MPI is checked here, so that bad input is reported
  // once and no rank starts: model name, dataset, schedules.
  ModelRegistry registry;
  models::register_builtin_models(registry);
  const bool gaussians = config.model.name == kGaussiansModel;
  if (!gaussians) registry.require(config.model.name, config.source_path);
  if (config.data.path.empty())
    throw UserError(config.source_path + ": data.path is empty; make a dataset with `tessera "
                    "synth` or `tessera convert` and set data.path (or --set data.path=FILE)");
  const data::SceneReader scene(config.data.path);
  TrainerOptions trainer = trainer_options(config);
  trainer.config_toml = resolved;
  trainer.stop_after = options.until;
  const std::string snapshot_dir = run_snapshot_dir(config.run.out_dir);
  if (!options.resume.empty() && options.resume != "auto") {
    // Format and root attributes only: load_snapshot verifies each dataset's checksum as it
    // reads it, so the file is read once, not twice.
    try {
      const SnapshotReader probe(options.resume);
    } catch (const UserError& e) {
      throw UserError(std::string("--resume: ") + e.what() +
                      " (use --resume auto to pick the newest good snapshot of the run)");
    }
  }
  LrSchedule{trainer.lr};
  SamplingSchedule{trainer.sampling};

  distributed::ProcessContext context(nullptr, nullptr, config.distributed.timeout_s);
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(config.run.out_dir) / "logs", ignored);
  log::init({context.rank(), config.run.log_level, config.run.out_dir, true});
  const int threads = context.apply_thread_share(static_cast<int>(config.distributed.threads));
  spdlog::info("tessera train {}: {} rank(s), local rank {} of {} on {} (from {}), {} CPU threads",
               options.config_path, context.size(), context.info().local_rank,
               context.info().local_size, context.info().hostname,
               context.info().local_rank_source, threads);
  spdlog::info("resolved config:\n{}", resolved);
  distributed::check_same_on_all_ranks(context, distributed::fingerprint(resolved),
                                       "the resolved config (check --set flags and config files)");

  const torch::Device device = context.one_cuda_device_per_rank()
                                   ? torch::Device(torch::kCUDA, context.cuda_device_index())
                                   : torch::Device(torch::kCPU);
  auto comm = distributed::make_communicator(context, config.distributed.backend, device);
  const std::string resume_path = resolve_resume(options.resume, snapshot_dir, context);
  if (gaussians) {
    GaussianRunOptions run;
    run.config_toml = resolved;
    run.resume = resume_path;
    run.until = options.until;
    return run_gaussian_train(config, run, context, *comm, scene);
  }
  const ModelContext model_context = ModelContext::from_scene(scene, device);
  std::unique_ptr<Model> model = registry.create(config, model_context);
  spdlog::info("model {} on {}, dataset {} ({} cameras), backend {}", model->name(), device.str(),
               config.data.path, scene.cameras().size(), distributed::to_string(comm->backend()));

  Trainer trainer_loop(context, *comm, *model, scene, trainer);
  apply_checkpoint_policy(config, *model, trainer_loop, *comm, device);
  if (!resume_path.empty()) {
    trainer_loop.load_snapshot(resume_path);
    if (context.rank() == 0)
      std::cerr << "resuming from " << resume_path << " at step " << trainer_loop.next_step() << "\n";
  }
  const TrainSummary summary = trainer_loop.run();
  (void)summary;  // the Trainer prints and records the summary on rank 0
  return kExitOk;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand("train", "Train a scene from a TOML config (run under mpirun "
                                              "for several ranks)");
  sub->add_option("config", options->config_path, "TOML config file (see docs/config.md)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--set", options->overrides,
                  "Override a config key: --set section.key=value (a TOML value; a bare word "
                  "such as a path is taken as a string). Repeatable")
      ->type_name("KEY=VALUE");
  sub->add_option("--log-level", options->log_level,
                  "Log level: trace, debug, info, warn or error (default: run.log_level)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  sub->add_option("--resume", options->resume,
                  "Continue a run from a snapshot: a path, or `auto` for the newest snapshot in "
                  "RUN_DIR/snapshots that validates (damaged ones are skipped with a warning; "
                  "none: start at step 0). The world size may differ from the run's")
      ->type_name("PATH|auto");
  sub->add_option("--until", options->until,
                  "Stop after this step, writing a snapshot, as a time-limited job would "
                  "(continue later with --resume auto). Default: train.steps")
      ->type_name("STEP")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  sub->add_flag("--print-config", options->print_config,
                "Print the resolved config (every key, defaults filled in) as TOML and exit");
  return {sub, [options] { return run_train(*options); }};
}

Command add_config_reference_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "config-reference", "Print the reference of every config key as Markdown (docs/config.md)");
  return {sub, [] {
            std::cout << config_reference_markdown();
            return kExitOk;
          }};
}

}  // namespace tessera::launch
