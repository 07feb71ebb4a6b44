// The ray family (docs/training_loop.md): sharded ray batches, micro-batch accumulation, bucketed
// gradient sync, Adam, LR and sampling schedules, eval renders split by rows across ranks.
#pragma once

#include <torch/optim.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/gradient_synchronizer.h"
#include "distributed/process_context.h"
#include "framework/data/scene.h"
#include "framework/family.h"
#include "framework/loss_scaler.h"
#include "framework/model.h"
#include "framework/ray_sampler.h"
#include "framework/run.h"
#include "framework/schedule.h"

namespace tessera {

// The ray family's options: the run's (steps, seed, precision, cadence, snapshots, ...) and its
// own. Model options are the Model's; activation checkpointing is set on the Model.
struct TrainerOptions : RunOptions {
  int64_t rays_per_step = 4096;   // global batch R, split across ranks and micro-batches
  int64_t micro_batches = 1;      // K: gradient accumulation steps per optimizer step
  LrScheduleOptions lr;
  SamplingScheduleOptions sampling;
  bool rescale_lr = false;        // lr *= sqrt(rate / rate_max) (schedule.h lr_rescale)
  double adam_beta1 = 0.9;        // instant-ngp's Adam settings
  double adam_beta2 = 0.99;
  double adam_eps = 1e-15;
  int64_t eval_chunk_rays = 16384;  // rays per render call during eval
  bool random_background = false;   // random training backgrounds (RaySamplerOptions)
  distributed::GradientSyncOptions grad_sync;
};

// What one optimizer step did (identical on every rank).
struct StepResult {
  int64_t step = 0;
  double loss = 0.0;   // global mean squared error over the batch's rays and channels
  double lr = 0.0;
  double sampling_rate = 1.0;
  double loss_scale = 1.0;
  bool skipped = false;  // non-finite gradient somewhere: no rank updated
  double seconds = 0.0;  // wall time of the step on this rank
  double samples_per_ray = 0.0;  // samples the model evaluated per ray on this rank (rank 0's
                                 // in metrics.jsonl): what empty-space skipping leaves
  double rendered_per_ray = 0.0; // of those, the samples rendered with gradients (nerf-hash:
                                 // those before the ray's transmittance ends; else all)
  PhaseTimes phases;             // this rank's seconds per phase (StepRecord::phases)
};

using EvalResult = EvalScores;

// The ray family: trains any ray Model (nerf-hash, nerf-mlp, test models) as a ModelFamily of
// the framework's TrainingRun. Also a ready run for code that trains a Model directly (tests, `bench
// nerf`): run(), train_step(), evaluate() and the snapshot calls go through a TrainingRun over this
// family, built with the TrainerOptions on first use.
class Trainer : public ModelFamily {
 public:
  // Reads all train images of `scene` (uint8, kept in memory). `model` lives on `comm.device()`.
  // Every rank must construct it with the same options (collective: gradient sync layout check).
  // Throws UserError on bad options (fp16 on CPU, K > rays per rank, ...).
  Trainer(distributed::ProcessContext& context, distributed::Communicator& comm, Model& model,
          const data::SceneReader& scene, TrainerOptions options);
  // The same, owning its model (the registered NeRF families).
  Trainer(distributed::ProcessContext& context, distributed::Communicator& comm,
          std::unique_ptr<Model> model, const data::SceneReader& scene, TrainerOptions options);
  ~Trainer() override;

  // ---- ModelFamily (trainer.cpp, trainer_eval.cpp, trainer_snapshot.cpp)
  std::string model_name() const override { return model_.name(); }
  std::string work_unit() const override { return "rays"; }
  StepRecord forward_backward(const StepControl& control) override;
  std::vector<torch::Tensor> gradients() override;
  void apply_step(const StepControl& control, bool skipped, StepRecord& record) override;
  EvalScores evaluate(int64_t step, const std::vector<size_t>& views,
                      const ImageSink& on_image) override;
  // Renders any camera (e.g. an orbit around the scene), with the scene's near/far: float32
  // [H, W, 3] on the CPU, rows split across ranks. Collective.
  torch::Tensor render_camera(const data::Camera& camera, int64_t step) override;
  void save_state(SnapshotWriter& writer) override;
  void load_state(const SnapshotReader& reader) override;
  std::string not_learning_causes() const override;
  std::string overfitting_causes() const override;
  // An epoch: the train views' pixels, nerf.rays_per_step at a time. set_total_steps rescales
  // the learning-rate and sampling schedules; eval_cost: a render's rays at a training ray's
  // time (an upper bound: measured 0.58 of it).
  EpochSize epoch_size() const override;
  void set_total_steps(int64_t steps) override;
  double eval_cost(const std::vector<size_t>& views) const override;

  // ---- The run over this family (framework/run.h), built on first use.
  TrainingRun& run_driver();
  // Trains steps [next_step(), options.steps), evaluating and logging as configured; collective.
  TrainSummary run() { return run_driver().run(); }
  // One optimizer step for `step` (collective).
  StepResult train_step(int64_t step);
  // Renders the eval views split by rows across ranks, scores them and (rank 0, when `write`
  // and out_dir is set) writes renders/step-NNNNNNNN-view-III.png. Collective.
  EvalResult evaluate(int64_t step, bool write = true) { return run_driver().evaluate(step, write); }
  // Renders camera `index` of the scene: float32 [H, W, 3] on every rank. Collective.
  torch::Tensor render_view(size_t index, int64_t step);
  std::string save_snapshot() { return run_driver().save_snapshot(); }
  void load_snapshot(const std::string& path) { run_driver().load_snapshot(path); }
  int64_t next_step() { return run_driver().next_step(); }
  // What evaluate() renders from now on: the split and at most `max_views` views (-1 = all).
  void set_eval_views(const std::string& split, int64_t max_views) {
    run_driver().set_eval_views(split, max_views);
  }
  const LossScaler& loss_scaler() { return run_driver().loss_scaler(); }

  RaySampler& sampler() { return *sampler_; }
  const TrainerOptions& options() const { return options_; }
  Model& model() { return model_; }
  torch::optim::Adam& optimizer() { return *optimizer_; }

  // Test hook: called with each micro-batch loss before backward; may replace it (e.g. by NaN).
  std::function<void(int64_t step, int64_t micro_batch, torch::Tensor& loss)> loss_hook;

 private:
  std::unique_ptr<Model> owned_model_;  // set by the owning constructor
  distributed::ProcessContext& context_;
  distributed::Communicator& comm_;
  Model& model_;
  const data::SceneReader& scene_;
  TrainerOptions options_;
  torch::Device device_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  std::unique_ptr<distributed::GradientSynchronizer> sync_;
  // The step's phases: sample, then the model's (march, encode, mlp, composite), loss, backward,
  // gradient_sync; optimizer and occupancy (the model's after_step) in apply_step.
  PhaseTimer phases_;
  std::unique_ptr<RaySampler> sampler_;
  LrSchedule lr_;
  SamplingSchedule sampling_;
  std::unique_ptr<TrainingRun> run_;  // run_driver()
  // Of the step in progress (forward_backward to apply_step).
  double step_lr_ = 0.0, step_rate_ = 1.0, samples_per_ray_ = 0.0, rendered_per_ray_ = 0.0;
};

}  // namespace tessera
