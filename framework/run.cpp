// TrainingRun construction, one optimizer step with the agreed non-finite policy, eval of the configured
// views, and the snapshot frame (meta, loss scaler, skip count) around the family's state.
#include "framework/run.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "framework/data/image_io.h"
#include "framework/budget.h"
#include "framework/learning_check.h"
#include "framework/memory.h"
#include "framework/snapshot.h"
#include "framework/tensorboard/event_file.h"
#include "framework/trainer_run.h"

namespace tessera {

RunOptions run_options(const Config& config) {
  RunOptions o;
  o.steps = config.train.steps;
  o.seed = static_cast<uint64_t>(config.run.seed);
  o.precision = config.train.precision;
  o.max_skipped_steps = config.train.max_skipped_steps;
  o.check_agreement = config.distributed.check_agreement;
  o.deterministic = config.run.deterministic;
  o.log_every = config.train.log_every;
  o.verbose = config.run.verbose;
  o.eval_every = config.eval.every;
  o.eval_split = config.eval.split;
  o.eval_max_views = config.eval.max_views;
  o.eval_train_views = config.eval.train_views;
  o.out_dir = config.run.out_dir;
  o.tensorboard = config.run.tensorboard;
  o.snapshot_every = config.snapshot.every;
  o.snapshot_keep = config.snapshot.keep;
  o.snapshot_parallel = config.snapshot.parallel;
  o.not_learning_steps = config.train.check_learning_after;
  o.epochs = config.train.epochs;
  o.time_budget_s = config.train.time_budget_minutes * 60.0;
  return o;
}

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

void check_run_options(const RunOptions& options, torch::Device device) {
  const std::string& p = options.precision;
  if (p != "fp32" && p != "bf16" && p != "fp16")
    throw UserError("train.precision must be one of fp32, bf16, fp16 (got \"" + p + "\")");
  // bf16 autocast runs on the CPU as on CUDA; fp16 needs CUDA's half-precision kernels.
  if (p == "fp16" && !device.is_cuda())
    throw UserError("train.precision = \"fp16\" needs a CUDA device; this run is on the CPU. "
                    "Use precision = \"bf16\" or \"fp32\".");
  if (options.steps < 0) throw UserError("train.steps must be >= 0");
  if (!(options.epochs >= 0)) throw UserError("train.epochs must be >= 0");
  if (!(options.time_budget_s >= 0)) throw UserError("train.time_budget_minutes must be >= 0");
  data::parse_split(options.eval_split, "eval.split");
}

TrainingRun::TrainingRun(distributed::ProcessContext& context, distributed::Communicator& comm,
         ModelFamily& family, const data::Dataset& dataset, RunOptions options)
    : context_(context), comm_(comm), family_(family), dataset_(dataset),
      options_(std::move(options)) {
  check_run_options(options_, comm_.device());
  const std::string& p = options_.precision;
  options_.loss_scaler.enabled = (p == "fp16");
  scaler_ = std::make_unique<LossScaler>(options_.loss_scaler);
  if (comm_.device().is_cpu()) install_counting_cpu_allocator();  // peak memory per rank
  if (!options_.out_dir.empty() && comm_.rank() == 0) {
    std::filesystem::create_directories(std::filesystem::path(options_.out_dir) / "renders");
    const std::string path = (std::filesystem::path(options_.out_dir) / "metrics.jsonl").string();
    // Opened here so that an unwritable run directory fails before training; run() reopens
    // it to keep a resumed run's earlier records (trainer_run.h).
    std::ofstream probe(path, std::ios::app);
    if (!probe) throw UserError("cannot open " + path + " for writing; check run.out_dir");
    if (options_.tensorboard) {
      const auto dir = std::filesystem::path(options_.out_dir) / "tensorboard";
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec)
        throw UserError("cannot create " + dir.string() + " (" + ec.message() +
                        "); check run.out_dir, or set run.tensorboard = false");
    }
  }
  start_ = std::chrono::steady_clock::now();
  budget_start_ = now();
  schedule_steps_ = options_.steps;
  plan_source_ = "train.steps";
  if (options_.epochs > 0) {
    const EpochSize epoch = family_.epoch_size();
    set_steps(steps_for_epochs(options_.epochs, epoch, family_.model_name()));
    char text[160];
    std::snprintf(text, sizeof(text), "train.epochs = %g epochs of %.4g %s, %.4g per step",
                  options_.epochs, epoch.work, family_.work_unit().c_str(), epoch.work_per_step);
    plan_source_ = text;
  }
  step_cap_ = options_.steps;
}

TrainingRun::~TrainingRun() = default;

void TrainingRun::set_eval_views(const std::string& split, int64_t max_views) {
  options_.eval_split = split;
  options_.eval_max_views = max_views;
}

StepRecord TrainingRun::train_step(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  StepControl control;
  control.step = step;
  control.seed = options_.seed;
  control.loss_scale = scaler_->scale();
  control.precision = options_.precision;
  StepRecord record = family_.forward_backward(control);
  record.step = step;
  record.loss_scale = control.loss_scale;

  // Skip decision: the local count of non-finite gradients, agreed by a max over all ranks.
  const auto check_start = std::chrono::steady_clock::now();
  torch::Tensor found = torch::tensor(
      {static_cast<int64_t>(scaler_->unscale_and_count_nonfinite(family_.gradients()) > 0)},
      torch::TensorOptions().dtype(torch::kInt64).device(comm_.device()));
  comm_.allreduce(found, distributed::ReduceOp::Max);
  record.skipped = scaler_->update(found.item<int64_t>() != 0);
  const double check_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - check_start).count();
  family_.apply_step(control, record.skipped, record);
  record.phases.emplace_back("skip_check", check_s);
  consecutive_skips_ = record.skipped ? consecutive_skips_ + 1 : 0;

  if (options_.check_agreement) {
    using distributed::check_same_on_all_ranks;
    check_same_on_all_ranks(context_, record.loss_scale,
                            "loss scale at step " + std::to_string(step));
    check_same_on_all_ranks(context_, static_cast<uint64_t>(record.skipped),
                            "skip-step decision at step " + std::to_string(step));
  }
  ++steps_done_;
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return record;
}

EvalScores TrainingRun::evaluate(int64_t step, bool write) {
  const double eval_start = now();
  const auto [views, train] = eval_view_lists();
  ImageSink sink;
  if (write && comm_.rank() == 0 && !options_.out_dir.empty()) {
    sink = [&](size_t view, const torch::Tensor& image, const torch::Tensor& target) {
      char name[64];
      std::snprintf(name, sizeof(name), "step-%08lld-view-%03zu.png",
                    static_cast<long long>(step), view);
      const auto renders = std::filesystem::path(options_.out_dir) / "renders";
      data::write_png_unit((renders / name).string(), image);
      // The target it was scored against (the run report shows them side by side): the same at
      // every eval, so written once per view by each process (a resumed run's too).
      if (targets_written_.insert(view).second) {
        std::snprintf(name, sizeof(name), "target-view-%03zu.png", view);
        data::write_png_unit((renders / name).string(), target);
      }
      if (tensorboard_) {
        std::snprintf(name, sizeof(name), "eval/view_%03zu", view);
        const torch::Tensor pair = torch::cat({image, target}, 1);  // render | target
        tensorboard_->image(name, step, pair.size(0), pair.size(1), data::encode_png_unit(pair));
      }
    };
  }
  EvalScores scores = family_.evaluate(step, views, sink);
  const double psnr = scores.value("psnr");
  if (train.empty() || !std::isfinite(psnr)) {
    last_eval_s_ = now() - eval_start;
    return scores;
  }
  const double train_psnr = family_.evaluate(step, train, {}).value("psnr");
  last_eval_s_ = now() - eval_start;
  scores.metrics.emplace_back("train_psnr", train_psnr);
  scores.metrics.emplace_back("psnr_gap", train_psnr - psnr);
  if (overfit_warned_) return scores;  // once per run: the causes do not change between evals
  if (const auto warning = overfitting_warning(psnr, train_psnr, family_.overfitting_causes())) {
    overfit_warned_ = true;
    if (comm_.rank() == 0) spdlog::warn("step {}: {}", step, *warning);
  }
  return scores;
}

std::string TrainingRun::save_snapshot() {
  if (options_.out_dir.empty()) throw std::logic_error("TrainingRun::save_snapshot needs an out_dir");
  SnapshotMeta meta;
  meta.step = steps_done_;
  meta.model = family_.model_name();
  meta.config_toml = options_.config_toml;
  meta.dataset_fingerprint = dataset_.fingerprint();
  SnapshotWriterOptions wo;
  wo.parallel = options_.snapshot_parallel;
  const double snapshot_start = now();
  const double elapsed = budget_elapsed();
  std::string written = write_run_snapshot(comm_, options_.out_dir, steps_done_,
                                           options_.snapshot_keep, [&](const std::string& path) {
    SnapshotWriter writer(context_, path, meta, wo);
    family_.save_state(writer);
    writer.write_replicated(snapshot_state("loss_scaler"),
                            torch::tensor(scaler_->state(), torch::kFloat64));
    writer.write_replicated(snapshot_state("consecutive_skips"),
                            torch::tensor(consecutive_skips_, torch::kInt64));
    // The plan (train.epochs, a time budget's) and the time spent, for a resumed budget.
    writer.write_replicated(snapshot_state("planned_steps"),
                            torch::tensor(options_.steps, torch::kInt64));
    writer.write_replicated(snapshot_state("schedule_steps"),
                            torch::tensor(schedule_steps_, torch::kInt64));
    writer.write_replicated(snapshot_state("budget_elapsed_s"),
                            torch::tensor(elapsed, torch::kFloat64));
    writer.commit();
  });
  last_snapshot_s_ = now() - snapshot_start;
  return written;
}

void TrainingRun::load_snapshot(const std::string& path) {
  const SnapshotReader reader(path);
  const SnapshotMeta& meta = reader.meta();
  // A time budget's plan continues where it was, with the time already spent; without a budget
  // the config's train.steps or train.epochs decide (e.g. raised to train on).
  if (options_.time_budget_s > 0 && reader.has(snapshot_state("planned_steps"))) {
    const int64_t planned = reader.read(snapshot_state("planned_steps")).item<int64_t>();
    const int64_t scheduled = reader.read(snapshot_state("schedule_steps")).item<int64_t>();
    if (planned >= meta.step && planned <= step_cap_ && scheduled >= 1 && scheduled <= step_cap_) {
      set_steps(scheduled);
      options_.steps = planned;  // below the schedules' count when the budget ended the run
      plan_source_ = "the time budget's plan, resumed from step " + std::to_string(meta.step);
    }
    elapsed_before_ = reader.read(snapshot_state("budget_elapsed_s")).item<double>();
  }
  check_snapshot_matches_run(path, meta, family_.model_name(), dataset_.fingerprint(),
                             options_.steps);
  family_.load_state(reader);
  // Snapshots that a family wrote before it trained through this run carry neither: a fresh
  // scaler and no skips, which is what those runs had.
  if (reader.has(snapshot_state("loss_scaler"))) {
    const torch::Tensor scaler = reader.read(snapshot_state("loss_scaler"));
    scaler_->load_state(std::vector<double>(scaler.data_ptr<double>(),
                                            scaler.data_ptr<double>() + scaler.numel()));
  }
  consecutive_skips_ = reader.has(snapshot_state("consecutive_skips"))
                           ? reader.read(snapshot_state("consecutive_skips")).item<int64_t>()
                           : 0;
  steps_done_ = meta.step;
  spdlog::info("resumed from {} at step {} (written by {} rank(s), now {})", path, meta.step,
               meta.world_size, comm_.size());
}

}  // namespace tessera
