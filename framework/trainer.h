// The NeRF training loop (docs/training_loop.md): sharded ray batches, micro-batch accumulation, bucketed
// gradient sync, loss scaling, Adam, LR and sampling schedules, eval and run-directory output.
#pragma once

#include <torch/torch.h>

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
#include "framework/loss_scaler.h"
#include "framework/model.h"
#include "framework/ray_sampler.h"
#include "framework/schedule.h"

namespace tessera {

struct TrainerOptions {
  int64_t steps = 2000;           // optimizer steps
  int64_t rays_per_step = 4096;   // global batch R, split across ranks and micro-batches
  int64_t micro_batches = 1;      // K: gradient accumulation steps per optimizer step
  uint64_t seed = 0;              // all randomness is a function of (seed, step, purpose)
  LrScheduleOptions lr;
  SamplingScheduleOptions sampling;
  bool rescale_lr = false;        // lr *= sqrt(rate / rate_max) (schedule.h lr_rescale)
  LossScalerOptions loss_scaler;  // `enabled` is forced on for fp16 and off otherwise
  double adam_beta1 = 0.9;        // instant-ngp's Adam settings
  double adam_beta2 = 0.99;
  double adam_eps = 1e-15;
  int64_t log_every = 100;        // progress line + metrics.jsonl record (0 = only at the end)
  int64_t eval_every = 0;         // eval cadence in steps (0 = only at the end)
  std::string eval_split = "val"; // "train" | "val" | "test"
  int64_t eval_max_views = 4;     // at most this many views of the split (first ones)
  int64_t eval_chunk_rays = 16384;  // rays per render call during eval
  std::string out_dir;            // run directory; "" = write no files
  std::string precision = "fp32"; // "fp32" | "bf16" | "fp16" (the latter two on CUDA only)
  bool check_agreement = false;   // debug: check lr, rate, scale, skip on all ranks every step
  bool progress = true;           // rank 0 prints the progress line on stderr
  // Snapshots (RUN_DIR/snapshots, needs out_dir): every N steps (0 = only at the end), and
  // always at the end of run(), at `stop_after` and on SIGTERM/SIGINT.
  int64_t snapshot_every = 0;
  int64_t snapshot_keep = 3;          // newest snapshots kept (0 = all)
  bool snapshot_parallel = true;      // parallel HDF5 for sharded state
  std::string config_toml;            // the resolved config, stored in every snapshot
  // run() returns after this many steps (snapshot written) as if interrupted; -1 = `steps`.
  int64_t stop_after = -1;
  int64_t max_skipped_steps = 100;    // consecutive non-finite steps that stop the run (error)
  bool random_background = false;     // random training backgrounds (RaySamplerOptions)
  // A run whose loss has not improved after this many steps gets a warning naming the likely
  // causes (framework/learning_check.h; 0 = never).
  int64_t not_learning_steps = 300;
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
};

struct EvalResult {
  int64_t views = 0;
  double psnr = 0.0;  // mean over views
  double ssim = 0.0;
};

struct TrainSummary {
  int64_t steps = 0;          // steps done when run() returned (the next step to train)
  bool finished = false;      // all `steps` done (false: stopped by a signal or stop_after)
  std::string last_snapshot;  // the snapshot written last ("" when none)
  double seconds = 0.0;
  double final_loss = 0.0;
  double rays_per_s = 0.0;  // global rays per second over the run
  double eval_psnr = 0.0;   // of the final eval (0 when no eval view exists)
  double eval_ssim = 0.0;
  int64_t eval_views = 0;
  int64_t skipped_steps = 0;
  int64_t peak_mem_bytes = 0;  // this rank's device peak
};

class Trainer {
 public:
  // Reads all train images of `scene` (uint8, kept in memory). `model` lives on `comm.device()`.
  // Every rank must construct it with the same options (collective: gradient sync layout check).
  // Throws UserError on bad options (bf16/fp16 on CPU, K > rays per rank, ...).
  Trainer(distributed::ProcessContext& context, distributed::Communicator& comm, Model& model,
          const data::SceneReader& scene, TrainerOptions options);
  ~Trainer();

  // Trains steps [next_step(), options.steps), evaluating and logging as configured; collective.
  TrainSummary run();
  // One optimizer step for `step` (collective); for tests and run().
  StepResult train_step(int64_t step);
  // Renders the eval views split by rows across ranks, scores them and (rank 0, when `write`
  // and out_dir is set) writes renders/step-NNNNNNNN-view-III.png. Collective.
  EvalResult evaluate(int64_t step, bool write = true);
  // Renders camera `index` of the scene: float32 [H, W, 3] on every rank. Collective.
  torch::Tensor render_view(size_t index, int64_t step);
  // The same for any camera (e.g. an orbit around the scene), with the scene's near/far.
  torch::Tensor render_camera(const data::Camera& camera, int64_t step);

  // Snapshots (trainer_snapshot.cpp, layout in docs/formats.md). save_snapshot writes the state
  // after next_step() steps to RUN_DIR/snapshots/step-NNNNNNNN.h5 and rotates; collective.
  // load_snapshot restores parameters, Adam state, model state and loss scaler on every rank and
  // continues at the snapshot's step; it refuses (UserError) a snapshot of another model kind or
  // dataset. The world size may differ from the writer's.
  std::string save_snapshot();
  void load_snapshot(const std::string& path);
  int64_t next_step() const { return steps_done_; }
  // Identifies the dataset: its cameras, image sizes, splits and root attributes.
  static std::string dataset_fingerprint(const data::SceneReader& scene);

  RaySampler& sampler() { return *sampler_; }
  const TrainerOptions& options() const { return options_; }
  // What evaluate() renders from now on: the split and at most `max_views` views (-1 = all).
  void set_eval_views(const std::string& split, int64_t max_views) {
    options_.eval_split = split;
    options_.eval_max_views = max_views;
  }
  torch::optim::Adam& optimizer() { return *optimizer_; }
  const LossScaler& loss_scaler() const { return *scaler_; }

  // Test hook: called with each micro-batch loss before backward; may replace it (e.g. by NaN).
  std::function<void(int64_t step, int64_t micro_batch, torch::Tensor& loss)> loss_hook;

 private:
  // trainer_output.cpp
  void open_metrics();
  void log_step(const StepResult& result, const EvalResult* eval, double rays_per_s);
  void write_summary(const TrainSummary& summary);

  distributed::ProcessContext& context_;
  distributed::Communicator& comm_;
  Model& model_;
  const data::SceneReader& scene_;
  TrainerOptions options_;
  torch::Device device_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  std::unique_ptr<distributed::GradientSynchronizer> sync_;
  std::unique_ptr<RaySampler> sampler_;
  std::unique_ptr<LossScaler> scaler_;
  LrSchedule lr_;
  SamplingSchedule sampling_;
  std::ofstream metrics_;  // rank 0, when out_dir is set
  std::chrono::steady_clock::time_point start_;
  int64_t steps_done_ = 0;
  int64_t consecutive_skips_ = 0;
};

}  // namespace tessera
