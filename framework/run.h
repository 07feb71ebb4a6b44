// The training run, written once for every model family (docs/architecture.md): the step loop
// with the agreed non-finite policy and loss scaling, eval cadence, metrics.jsonl, the progress
// line, snapshots (periodic, --until, SIGTERM/SIGINT, final), peak memory and the summary.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/process_context.h"
#include "framework/config.h"
#include "framework/data/dataset.h"
#include "framework/family.h"
#include "framework/loss_scaler.h"
#include "framework/schedule.h"

namespace tessera {

class TensorBoardEventFile;  // framework/tensorboard/event_file.h

struct RunOptions {
  int64_t steps = 2000;            // optimizer steps
  uint64_t seed = 0;               // all randomness is a function of (seed, step, purpose)
  std::string precision = "fp32";  // "fp32" | "bf16" | "fp16" (fp16 on CUDA only)
  LossScalerOptions loss_scaler;   // `enabled` is forced on for fp16 and off otherwise
  int64_t max_skipped_steps = 100; // consecutive non-finite steps that stop the run (error)
  bool check_agreement = false;    // debug: check the loss scale and skip on all ranks each step
  // Bitwise at any world size (run.deterministic; docs/training_loop.md): families with work
  // units sum them exactly. Off here so that code building options by hand picks it.
  bool deterministic = false;
  int64_t log_every = 100;         // progress line + metrics.jsonl record (0 = only at the end)
  int64_t eval_every = 0;          // eval cadence in steps (0 = only at the end)
  std::string eval_split = "val";  // "train" | "val" | "test"
  int64_t eval_max_views = 4;      // at most this many views, spread over the split; -1 all
  // Image families: train views also scored (spread over the train split), for the train-eval
  // PSNR gap; a gap over kOverfitGapDb warns with ModelFamily::overfitting_causes. 0 = off.
  int64_t eval_train_views = 0;
  std::string out_dir;             // run directory; "" = write no files
  bool tensorboard = true;         // RUN_DIR/tensorboard event files (rank 0)
  bool progress = true;            // rank 0 prints the progress line on stderr
  bool verbose = false;            // the progress line adds the seconds per phase (run.verbose)
  // Snapshots (RUN_DIR/snapshots, needs out_dir): every N steps (0 = only at the end), and
  // always at the end of run(), at `stop_after` and on SIGTERM/SIGINT.
  int64_t snapshot_every = 0;
  int64_t snapshot_keep = 3;       // newest snapshots kept (0 = all)
  bool snapshot_parallel = true;   // parallel HDF5 for sharded state
  std::string config_toml;         // the resolved config, stored in every snapshot
  // run() returns after this many steps (snapshot written) as if interrupted; -1 = `steps`.
  int64_t stop_after = -1;
  // A run whose loss has not improved after this many steps gets a warning naming the likely
  // causes (framework/learning_check.h; 0 = never).
  int64_t not_learning_steps = 300;
  // Budgets (framework/budget.h): > 0 replaces `steps` by this many passes over the training
  // data (ModelFamily::epoch_size), and plans the steps to end within this many seconds.
  double epochs = 0.0;
  double time_budget_s = 0.0;
  // Seconds on a monotonic clock, for the time budget; empty = std::chrono::steady_clock.
  // Tests give a clock of their own, so that a plan does not depend on the machine's speed.
  std::function<double()> clock;
  // Forecast the final eval from a timed ModelFamily::eval_probe where the family has one; false:
  // from ModelFamily::eval_cost only (tests of that forecast on a clock of their own).
  bool eval_probe = true;
};

// The RunOptions of a resolved config: [train] steps, epochs, time_budget_minutes, precision,
// log_every, max_skipped_steps, check_learning_after; [eval]; [snapshot]; run.seed, run.out_dir;
// distributed.check_agreement.
RunOptions run_options(const Config& config);
// The [sampling] schedule of a resolved config (what it samples is the family's, e.g. the rays
// or the views of an epoch).
SamplingScheduleOptions sampling_options(const Config& config);
// UserError unless the options can run on `device`: a known precision (fp16 needs CUDA), steps
// >= 0, a known eval split. TrainingRun's constructor checks them; families may check earlier.
void check_run_options(const RunOptions& options, torch::Device device);

struct TrainSummary {
  int64_t steps = 0;          // steps done when run() returned (the next step to train)
  bool finished = false;      // all `steps` done (false: stopped by a signal or stop_after)
  bool stopped_by_signal = false;  // the ranks agreed to stop on SIGTERM/SIGINT (exit code 4)
  std::string last_snapshot;  // the snapshot written last ("" when none)
  double seconds = 0.0;
  double final_loss = 0.0;
  double work_per_s = 0.0;    // the family's work units (rays, views) per second over the run
  EvalScores eval;            // of the final eval (no items when none ran)
  int64_t skipped_steps = 0;
  int64_t peak_mem_bytes = 0;  // this rank's device peak
};

class TrainingRun {
 public:
  // Every rank constructs it with the same options. UserError on bad options (fp16 on the CPU,
  // an unknown precision or eval split, an unwritable run directory).
  TrainingRun(distributed::ProcessContext& context, distributed::Communicator& comm,
              ModelFamily& family, const data::Dataset& dataset, RunOptions options);
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // Trains steps [next_step(), options.steps) (or to stop_after), evaluating, logging and
  // snapshotting as configured; writes the family's outputs when finished. Collective.
  TrainSummary run();
  // The steps the run trains now: options.steps, or what train.epochs and the time budget
  // planned (the progress line's total).
  int64_t planned_steps() const { return options_.steps; }
  // One optimizer step (collective): the family's forward and backward, the non-finite count
  // agreed across ranks (max), the loss scaler's update, then the family's update or skip.
  StepRecord train_step(int64_t step);
  // Renders and scores the eval views (split and count from the options); rank 0 writes
  // RUN_DIR/renders/step-NNNNNNNN-view-III.png when `write` and out_dir is set, and the render
  // beside its target to TensorBoard (tag eval/view_III). Collective.
  EvalScores evaluate(int64_t step, bool write = true);

  // Snapshots (layout in docs/formats.md). save_snapshot writes the state after next_step()
  // steps to RUN_DIR/snapshots/step-NNNNNNNN.h5 and rotates; collective. load_snapshot restores
  // the family's state, the loss scaler and the skip count on every rank and continues at the
  // snapshot's step; it refuses (UserError) a snapshot of another model or dataset, or past
  // `steps`. The world size may differ from the writer's.
  std::string save_snapshot();
  void load_snapshot(const std::string& path);
  int64_t next_step() const { return steps_done_; }

  ModelFamily& family() { return family_; }
  const RunOptions& options() const { return options_; }
  // What evaluate() renders from now on: the split and at most `max_views` views (-1 = all).
  void set_eval_views(const std::string& split, int64_t max_views);
  const LossScaler& loss_scaler() const { return *scaler_; }

 private:
  // `phases`: rank 0's mean seconds per phase over the steps since the last record.
  void log_step(const StepRecord& record, const PhaseTimes& phases, const EvalScores* eval,
                double work_per_s, double steps_per_s);
  void write_summary(const TrainSummary& summary, const std::string& outputs);
  // RUN_DIR/config.toml: the resolved config this process trains with (rank 0, atomically).
  void write_config_copy();
  // RUN_DIR/ranks.json after step `done` (docs/formats.md): each rank's host, device, peak
  // memory by kind (ModelFamily::memory_parts) and mean seconds per phase since this process
  // started, gathered on rank 0 and replaced atomically. Collective.
  void write_ranks(int64_t done);
  // Budgets (run_budget.cpp). The eval views and the train views scored beside them.
  std::pair<std::vector<size_t>, std::vector<size_t>> eval_view_lists() const;
  double now() const;
  // Seconds since the run started, counting a resumed run's time before its snapshot.
  double budget_elapsed() const { return now() - budget_start_; }
  // The plan's first line.
  std::string plan_text() const;
  // When run() starts at step `first`: the budget's clock and first plan point; logs the plan
  // (rank 0 prints it).
  void start_budget(int64_t first);
  // After step `step` took `step_s` seconds on this rank: with a time budget, the step times
  // measured, replan() and out_of_time() (which ends the run after this step by lowering
  // options_.steps to it). Collective.
  void budget_step(int64_t step, double step_s);
  // The time kept for the final eval and snapshot: the measured ones (< 0: none yet, then the
  // eval's forecast from ModelFamily::eval_cost, from the second plan on).
  double budget_reserve(double eval_s, double snapshot_s) const;
  // ModelFamily::eval_cost of the eval's views and the train views scored beside them, now.
  double forecast_eval_cost() const;
  // The final eval's seconds on this rank from a timed ModelFamily::eval_probe of the same
  // views at step `step`, times kEvalProbeMargin; < 0 where the family does not probe.
  double probe_eval_seconds(int64_t step);
  // After step `done` with a time budget: every kReplanEvery steps, the steps that fit the
  // budget from the step times since the last plan (collective; all ranks adopt the same).
  void replan(int64_t done);
  // After step `done` with a time budget: whether the ranks agree that the next step would
  // overrun it (collective); if so the run ends at `done`.
  bool out_of_time(int64_t done);
  // The run trains `steps` steps, the family's schedules rescaled to them.
  void set_steps(int64_t steps);

  distributed::ProcessContext& context_;
  distributed::Communicator& comm_;
  ModelFamily& family_;
  const data::Dataset& dataset_;
  RunOptions options_;
  std::unique_ptr<LossScaler> scaler_;
  std::ofstream metrics_;  // rank 0, when out_dir is set
  std::unique_ptr<TensorBoardEventFile> tensorboard_;  // rank 0, with out_dir and options.tensorboard
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = 0;   // the step run() started at (for the ETA)
  int64_t steps_done_ = 0;
  int64_t consecutive_skips_ = 0;
  bool overfit_warned_ = false;  // the train-eval gap warning is given once per run
  std::set<size_t> targets_written_;  // rank 0: views whose renders/target-view-III.png is written
  PhaseTimes run_phases_;        // this rank's seconds per phase, summed over this process's steps
  int64_t run_phase_steps_ = 0;  // the steps summed in run_phases_
  // Budgets: the most steps (train.steps or the epochs' count); how it was chosen; the clock
  // reading the run's elapsed time counts from; the step times since the last plan (seconds and
  // ModelFamily::step_cost units); the latest seconds per cost unit; the last eval's and
  // snapshot's seconds (< 0: none yet); the step of the next plan.
  int64_t step_cap_ = 0;
  int64_t schedule_steps_ = 0;  // what the family's schedules were last set to (set_total_steps)
  std::string plan_source_;
  double budget_start_ = 0.0;
  double elapsed_before_ = 0.0;
  double window_s_ = 0.0, window_cost_ = 0.0;
  double smoothed_s_ = 0.0, smoothed_cost_ = 0.0;  // the windows so far, weighted (replan)
  double seconds_per_cost_ = 0.0;
  double last_step_s_ = 0.0;  // this rank's, for the guard: a step may be slower than planned
  double last_eval_s_ = -1.0, last_snapshot_s_ = -1.0;
  double eval_cost_ = 0.0;  // forecast_eval_cost(), the ranks' largest, at the last plan
  double eval_forecast_s_ = 0.0;  // the final eval's forecast at the last plan (seconds)
  int64_t plans_ = 0;       // plans taken since start_budget
  bool forecast_deferred_ = false;  // the first plan trains past the eval's forecast (replan)
  bool eval_warned_ = false;  // the eval-does-not-fit warning is given once
  int64_t next_replan_ = 0;
};

}  // namespace tessera
