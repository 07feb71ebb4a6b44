// The ray family (docs/training_loop.md): sharded ray batches, micro-batch accumulation, bucketed
// gradient sync, Adam, LR and sampling schedules, eval renders in chunks dealt round-robin to
// the ranks.
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
#include "framework/data_parallel.h"
#include "framework/family.h"
#include "framework/loss_scaler.h"
#include "framework/run.h"
#include "framework/schedule.h"
#include "models/nerf/nerf_config.h"
#include "models/nerf/ray_model.h"
#include "models/nerf/ray_sampler.h"

namespace tessera::models::nerf {

// The ray family's options: the run's (steps, seed, precision, cadence, snapshots, ...), the
// [nerf] section as it is (NerfConfig: the ray batch, the learning-rate schedule, Adam's eps,
// the background; the model sizes in it are the Model's), the [sampling] schedule and the
// gradient buckets. Model options are the Model's; activation checkpointing is set on the Model.
struct RayTrainerOptions : RunOptions {
  NerfConfig nerf;
  SamplingScheduleOptions sampling;
  bool rescale_lr = false;        // lr *= sqrt(rate / rate_max) (schedule.h lr_rescale)
  double adam_beta1 = 0.9;        // instant-ngp's Adam settings
  double adam_beta2 = 0.99;
  // Rays per render call during eval; 0 = by device (RayTrainer::eval_chunk): 16384 on a GPU,
  // 2048 on a CPU, where 16384-ray chunks (millions of samples, 4x the memory) rendered the fruit
  // capture's views 1.5-1.6x slower than 512-4096 (docs/training_loop.md, "Eval and output").
  int64_t eval_chunk_rays = 0;
  distributed::GradientSyncOptions grad_sync;
};

// The ray family: trains any ray Model (nerf-hash, nerf-mlp, test models) as a data-parallel
// family (framework/data_parallel.h) of the framework's TrainingRun: each micro-batch renders
// its slice of this rank's rays. Also a ready run for code that trains a Model directly (tests, `bench
// nerf`): run(), train_step(), evaluate() and the snapshot calls go through a TrainingRun over this
// family, built with the RayTrainerOptions on first use.
class RayTrainer : public DataParallelFamily, public ViewRenderer {
 public:
  // Reads all train images of `scene` (uint8, kept in memory). `model` lives on `comm.device()`.
  // Every rank must construct it with the same options (collective: gradient sync layout check).
  // Throws UserError on bad options (fp16 on CPU, K > rays per rank, ...).
  RayTrainer(distributed::ProcessContext& context, distributed::Communicator& comm, Model& model,
          const data::SceneReader& scene, RayTrainerOptions options);
  // The same, owning its model (the registered NeRF families).
  RayTrainer(distributed::ProcessContext& context, distributed::Communicator& comm,
          std::unique_ptr<Model> model, const data::SceneReader& scene, RayTrainerOptions options);
  ~RayTrainer() override;

  // ---- ModelFamily (ray_trainer.cpp, ray_trainer_eval.cpp, ray_trainer_snapshot.cpp)
  std::string model_name() const override { return model_.name(); }
  std::string work_unit() const override { return "rays"; }
  EvalScores evaluate(int64_t step, const std::vector<size_t>& views,
                      const ImageSink& on_image) override;
  // Renders any camera (e.g. an orbit around the scene), with the scene's near/far: float32
  // [H, W, 3] on the CPU, in chunks dealt round-robin to the ranks. Collective.
  torch::Tensor render_camera(const data::Camera& camera, int64_t step) override;
  std::string render_layout() override;
  ViewOutputs render_outputs(const data::Camera& camera, int64_t step) override;
  ViewRenderer* view_renderer() override { return this; }
  void save_state(SnapshotWriter& writer) override;
  void load_state(const SnapshotReader& reader) override;
  std::string not_learning_causes() const override;
  std::string overfitting_causes() const override;
  // An epoch: the train views' pixels, nerf.rays_per_step at a time. set_total_steps rescales
  // the learning-rate and sampling schedules; eval_cost: a render's rays at a training ray's
  // time (an upper bound: measured 0.54-0.58 of it; the run forecasts from eval_probe instead).
  EpochSize epoch_size() const override;
  void set_total_steps(int64_t steps) override;
  double eval_cost(const std::vector<size_t>& views) const override;
  // Renders rays_per_step of this rank's eval pixels of the views, spread evenly over them and
  // gathered across the views, in calls of at most eval_chunk() rays (ray_trainer_eval.cpp): this
  // rank's eval speed now. Returns that count over this rank's eval pixels.
  double eval_probe(const std::vector<size_t>& views, int64_t step) override;

  // ---- The run over this family (framework/run.h), built on first use.
  TrainingRun& run_driver();
  // Trains steps [next_step(), options.steps), evaluating and logging as configured; collective.
  TrainSummary run() { return run_driver().run(); }
  // One optimizer step for `step` (collective). Its fields (metrics.jsonl) hold the step's "lr",
  // "sampling_rate", "samples_per_ray" and "rendered_per_ray".
  StepRecord train_step(int64_t step) { return run_driver().train_step(step); }
  // Renders the eval views (chunks dealt round-robin to the ranks), scores them and (rank 0,
  // when `write` and out_dir is set) writes renders/step-NNNNNNNN-view-III.png. Collective.
  EvalScores evaluate(int64_t step, bool write = true) { return run_driver().evaluate(step, write); }
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
  const RayTrainerOptions& options() const { return options_; }
  // The learning-rate schedule's options: [nerf]'s, over the steps of the current plan.
  const LrScheduleOptions& lr_options() const { return lr_options_; }
  Model& model() { return model_; }

 protected:
  // ---- DataParallelFamily (ray_trainer.cpp). Phases: sample, then the model's (march, encode,
  // mlp, composite), loss, backward, gradient_sync; optimizer and occupancy (the model's
  // after_step) after the update.
  double begin_step(const StepControl& control) override;
  MicroBatchLoss micro_batch_loss(const StepControl& control, int64_t k, int64_t count) override;
  // run.deterministic: units of nerf.unit_rays rays of the global batch (0: rays_per_step / 16,
  // at least 256; the units' sizes differ by at most one), unit u built as rank u of U would
  // build its slice.
  int64_t work_units() const override;
  MicroBatchLoss unit_loss(const StepControl& control, int64_t unit, int64_t units) override;
  void end_step(StepRecord& record) override;
  void after_update(const StepControl& control) override;

 private:
  // A camera's pixels, in chunks of eval_chunk() dealt round-robin to the ranks and gathered on
  // every rank: [H, W, 3] colour (unclamped), or with `geometry` [H, W, 5]: colour, expected
  // z-depth, opacity (ViewOutputs).
  torch::Tensor render_columns(const data::Camera& camera, int64_t step, bool geometry);
  // options_.eval_chunk_rays, or when 0 the device's default (RayTrainerOptions).
  int64_t eval_chunk() const;
  // The row-major indices [n] of the pixels of a view of `pixels` pixels that `rank` renders
  // (strided_chunks of eval_chunk(), one after another).
  torch::Tensor rank_pixels(int64_t pixels, int rank) const;
  // The eval's rays through pixels `pix` [n] (row-major indices) of `camera`, on the device: the
  // scene's near, far and background, each pixel's index its ray id.
  RayBatch view_rays(const data::Camera& camera, const torch::Tensor& pix) const;
  // The same over several cameras: ray i through pixel pix[i] of cameras[camera[i]] (the probe's
  // rays of all eval views in one batch).
  RayBatch view_rays(const std::vector<data::Camera>& cameras, const torch::Tensor& camera,
                     const torch::Tensor& pix) const;
  // The loss of a batch of rays (a micro-batch or a unit) of step control.step.
  MicroBatchLoss rays_loss(const StepControl& control, const RayBatch& rays);
  std::unique_ptr<Model> owned_model_;  // set by the owning constructor
  distributed::ProcessContext& context_;
  distributed::Communicator& comm_;
  Model& model_;
  const data::SceneReader& scene_;
  RayTrainerOptions options_;
  torch::Device device_;
  std::unique_ptr<RaySampler> sampler_;
  LrScheduleOptions lr_options_;
  LrSchedule lr_;
  SamplingSchedule sampling_;
  std::unique_ptr<TrainingRun> run_;  // run_driver()
  // Of the step in progress (forward_backward to apply_step).
  RayBatch batch_;  // this rank's rays
  double step_lr_ = 0.0, step_rate_ = 1.0;
  int64_t samples_ = 0, rendered_ = 0;  // samples marched and rendered by this rank
};

}  // namespace tessera::models::nerf
