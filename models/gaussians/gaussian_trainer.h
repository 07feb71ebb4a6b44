// Sharded 3DGS training in the manner of Grendel-GS (docs/gaussians.md): Gaussians owned by ranks,
// image tiles split across ranks, projected attributes exchanged by all-to-all-v, Adam local.
#pragma once

#include <torch/optim.h>
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "models/gaussians/gaussian_sharding.h"
#include "framework/data/scene.h"
#include "framework/family.h"
#include "framework/memory.h"
#include "framework/phase_timer.h"
#include "framework/schedule.h"
#include "framework/snapshot.h"
#include "framework/thread_invariance.h"
#include "models/gaussians/densify.h"
#include "models/gaussians/gaussian_config.h"
#include "models/gaussians/gaussian_loss.h"
#include "models/gaussians/gaussian_params.h"
#include "models/gaussians/stereo_init.h"

namespace tessera::models::gaussians {

// The trainer's options: the [gaussians] section as it is (GaussianConfig, gaussian_config.h)
// and what the run supplies from the framework's sections (gaussian_trainer_options in
// gaussian_family.h binds them from a config). `t` below is the 0-based step index passed to
// step(); s = t + 1 is the 1-based number of the step (INRIA's `iteration`) that the schedules
// (learning rate, densification, SH degree) see.
struct GaussianTrainerOptions : GaussianConfig {
  int64_t steps = 30000;  // train.steps: planned steps (the schedules' length; step(t) takes any t)
  uint64_t seed = 0;      // run.seed: the view order (init.seed and densify.seed seed the rest)
  // [sampling]: the fraction of the train views visited per epoch (batch_views). An epoch
  // starting at step s reads rate r(s) once and visits the first ceil(r n) views of its
  // permutation; total_steps is set from `steps` when left at 1.
  SamplingScheduleOptions sampling;
  // checkpoint.budget_mib with policy "budget": per rank, for the views per pass; < 0: none.
  int64_t memory_budget_bytes = -1;
  // run.deterministic: bitwise at any world size (docs/training_loop.md, "Bitwise at any world
  // size"): one exchanged row per (tile, Gaussian) so that a Gaussian's gradient adds its tiles
  // in tile order on its owner, the image gradient passed through as every rank computes it, and
  // passes of views_per_pass views (0: the budget's split as if one rank held every Gaussian,
  // or the whole batch without a budget).
  bool deterministic = false;
};

struct GaussianStepResult {
  double loss = 0;                  // mean photometric loss over the batch, same on every rank
  std::vector<int64_t> views;       // camera indices of the batch
  int sh_degree = 0;
  double resolution_scale = 1;  // the downscale the step trained at
  int64_t views_per_pass = 1;   // views rendered and backpropagated together
  bool densified = false, opacity_reset = false, rebalanced = false;
  int64_t cloned = 0, split = 0, pruned = 0;  // global counts of this step's densification
  int64_t global_count = 0;                   // Gaussians after the step
  // This rank's seconds per phase (framework/phase_timer.h): project, sh, exchange (the tile
  // split, the all-to-all of projected rows and the image allreduce, both ways), bin, rasterize,
  // loss (forward and backward), rasterize_bwd, project_bwd (SH and projection backward), stats
  // (densification statistics), optimizer, densify (densification, opacity reset, rebalancing).
  PhaseTimes phases;
};

// The sharded trainer. Every public function but the local accessors is collective: all ranks
// call it in the same order with the same arguments. The results do not depend on the world
// size up to float reassociation (tests/test_gaussian_trainer.cpp).
class GaussianTrainer {
 public:
  // Every rank builds the full initial set (deterministic), global id = row, keeps a disjoint
  // slice and migrates to Morton ownership (rebalance with force), then builds Adam on its rows.
  GaussianTrainer(distributed::Communicator& comm, const data::SceneReader& scene,
                  const GaussianTrainerOptions& options = {});
  ~GaussianTrainer();
  GaussianTrainer(const GaussianTrainer&) = delete;
  GaussianTrainer& operator=(const GaussianTrainer&) = delete;

  // One training step on the batch batch_views(t): forward_backward then apply_step. Collective.
  GaussianStepResult step(int64_t t);
  // The two halves of a step, for a TrainingRun that decides in between whether to skip it (framework/
  // run.h). forward_backward leaves in the local rows the gradients of the batch loss times
  // `loss_scale`, the render run under autocast `precision` (its kernels compute in float32,
  // so today bf16 changes no value) and the loss in float32;
  // the densify statistics of the batch wait for apply_step. apply_step takes the Adam step and
  // keeps the statistics (both unless `skipped`), then densifies, resets opacities and
  // rebalances as scheduled. Collective.
  GaussianStepResult forward_backward(int64_t t, double loss_scale = 1.0,
                                      const std::string& precision = "fp32");
  void apply_step(int64_t t, bool skipped, GaussianStepResult& result);
  // The local rows' gradients (the six fields, kGroupNames order) after forward_backward.
  std::vector<torch::Tensor> gradients() const;
  // Test hook: called with each pass's summed view loss before backward; may replace it.
  std::function<void(int64_t step, torch::Tensor& loss)> loss_hook;

  // The camera indices of step t's views: a pure function of (seed, t). The train views are
  // visited in epochs; epoch e is the permutation that sorts them by hash(seed, e, view).
  std::vector<int64_t> batch_views(int64_t t) const;
  int sh_degree_at(int64_t t) const;          // active SH degree of step t
  double sampling_rate_at(int64_t t) const;   // the rate of the epoch that step t belongs to
  double resolution_scale_at(int64_t t) const;  // the downscale step t trains at
  // The run now trains `steps` steps (a budget's plan, framework/budget.h): the schedules
  // written for options().steps at construction (densify_from/until, resolution_schedule,
  // sh_degree_interval, lr_means_decay_steps, the sampling schedule) scale by steps / that
  // count; the periods (densify_every, opacity_reset_every, rebalance_every) stay. Collective
  // in that every rank must call it with the same value at the same step.
  void set_total_steps(int64_t steps);
  // Step t's relative time: its views' pixels at its resolution over one view's full pixels.
  double step_cost(int64_t t) const;
  // Views per pass for step t's batch `views` (collective: views_per_pass when set, else the
  // minimum over ranks of what each rank's memory budget allows by estimate_view_bytes for the
  // largest view of the batch, at least 1 (deterministic: for all Gaussians on one rank, the
  // same split at any world size); the whole batch without a budget).
  int64_t views_per_pass_for(int64_t t, const std::vector<int64_t>& views);
  // Estimated bytes one view of a pass holds until its backward on this rank: per local Gaussian
  // (projection, SH and their saved tensors and gradients) and per pixel (the full image, the
  // target and the loss's SSIM maps, which every rank computes). Measured: docs/gaussians.md.
  static constexpr int64_t kViewBytesPerGaussian = 200;
  static constexpr int64_t kViewBytesPerPixel = 200;
  static int64_t estimate_view_bytes(int64_t local_gaussians, int64_t pixels);

  // Renders camera `camera_index` with the sharded pipeline (no gradient) at SH degree
  // `sh_degree` (-1: the degree of the last step taken); the full image [H, W, 3] on every rank.
  // Collective.
  torch::Tensor render(int64_t camera_index, int sh_degree = -1);
  torch::Tensor render_camera(const data::Camera& camera, int sh_degree = -1);  // e.g. an orbit's
  // The view blended with each Gaussian's colour replaced by (view-space depth z, 1, 0) over a
  // black background: [H, W, 3] holding sum_i w_i z_i, sum_i w_i (the alpha) and 0. Collective.
  torch::Tensor render_depth_alpha(const data::Camera& camera);

  // Mean PSNR and SSIM over the dataset views `views` (clamped renders at resolution_scale vs the
  // targets composited over the background, resized to the render's size). `on_image` (if set)
  // receives each view's image [H, W, 3] in [0, 1] and that target, on every rank. SH degree
  // as render(). Collective.
  struct EvalScores {
    double psnr = 0, ssim = 0;
    int64_t views = 0;
  };
  EvalScores evaluate(const std::vector<size_t>& views, const ImageSink& on_image = {},
                      int sh_degree = -1);

  // Canonical (ordered by global id) views for tests and export. root < 0: on every rank;
  // otherwise on root only (undefined tensors elsewhere). Collective.
  GaussianParams canonical_params(int root = -1);
  std::array<torch::Tensor, 6> canonical_grads(int root = -1);  // zeros where no gradient
  torch::Tensor canonical_ids(int root = -1);                   // [N] int64 ascending
  // Rank 0 writes the canonical set, gathered a chunk of rows_per_chunk rows (in id order) at a
  // time: no rank holds more than one chunk of others' rows. A file that cannot be written is a
  // UserError on every rank. Collective.
  void export_ply(const std::string& path, int64_t rows_per_chunk = kExportRowsPerChunk);
  static constexpr int64_t kExportRowsPerChunk = int64_t{1} << 20;  // 236 MiB of parameters

  // ---- Snapshot state (gaussian_trainer_snapshot.cpp; layout: docs/formats.md, "Gaussian
  // runs"), written and read inside the TrainingRun's snapshots. The view order, learning rates,
  // SH degree and densify schedule are pure functions of the step, so the rows, their Adam moments
  // and densify statistics, the ids, the next id and the step count are the whole training state.
  static constexpr const char* kSnapshotModel = "gaussians";  // SnapshotMeta::model
  // Every rank's rows in rank order and the per-rank row counts (collective).
  void save_state(SnapshotWriter& writer);
  // Replaces the rows, Adam state, densify statistics, ids, next id and step count by those of
  // an open snapshot whose model and dataset the TrainingRun checked. At the writer's world size
  // every rank gets exactly its own rows back in their order (bitwise-exact continuation); at
  // another, an even slice of the rows, then a forced rebalance (with the Adam state). A damaged
  // snapshot (rank 0 checks every checksum) throws UserError on every rank with the same
  // message. Collective.
  void load_state(const SnapshotReader& reader);
  int64_t steps_done() const { return steps_done_; }  // steps taken = the next step to train

  // Migrates to Morton ownership when the imbalance exceeds the threshold (or when forced),
  // carrying the Adam moments and densify statistics. Collective.
  RebalanceReport rebalance(bool force);

  int64_t local_count() const { return params_.size(); }
  int64_t global_count();  // collective
  const GaussianParams& local_params() const { return params_; }
  const torch::Tensor& global_ids() const { return ids_; }  // [n] int64, row i's global id
  int64_t next_global_id() const { return next_id_; }
  double extent() const { return extent_; }
  MemoryStats memory() const;  // this rank's memory (peak since start / last reset_peak)
  torch::optim::Adam& optimizer() { return *optimizer_; }
  const GaussianTrainerOptions& options() const { return options_; }
  int64_t train_view_count() const { return static_cast<int64_t>(train_views_.size()); }
  // Pixels of the largest train view at options().resolution_scale (the full-resolution steps).
  int64_t largest_view_pixels() const;

 private:
  // Adds gaussians.opacity_reg's gradient to the owned rows' opacity logits (collective: the
  // global count). Nothing when the weight is 0.
  void add_opacity_regularizer(double loss_scale);
  // run.deterministic on the CPU: torch's ops on one thread while alive (framework/
  // thread_invariance.h: the loss's SSIM on a large image, for one, splits over threads); empty
  // elsewhere.
  std::optional<TorchOnOneThread> bitwise_threads() const;
  // The initial set when the scene has no points: stereo points, then random ones (this rank's
  // even slice, as init_from_scene's).
  GaussianParams init_from_stereo(const data::SceneReader& scene, const InitOptions& init,
                                  torch::Device device, int64_t* total);
  int64_t stereo_placed_ = 0;  // starting points that stereo placed (0 without stereo)
  // What step() needs from forward() per view: the owner's projection outputs.
  struct Batch {
    std::vector<torch::Tensor> radii;    // per view [n] int32
    std::vector<torch::Tensor> means2d;  // per view [n, 2], retain_grad() called when training
    std::vector<int64_t> widths, heights;
  };
  // Renders the views with the sharded pipeline: per view, the full image on every rank.
  // `depth_alpha`: each Gaussian's colour is (its view-space depth, 1, 0) and the background
  // black (render_depth_alpha).
  std::vector<torch::Tensor> forward(const std::vector<data::Camera>& cameras, int sh_degree,
                                     double scale, bool grad, Batch* batch,
                                     bool depth_alpha = false);
  // Epochs of the view sampling schedule, found by iterating from step 0 (cached).
  struct ViewEpoch {
    int64_t index = 0, first_step = 0, steps = 1, pool = 1;
    double rate = 1;
  };
  ViewEpoch epoch_of(int64_t t) const;
  torch::Tensor target(int64_t camera_index, double scale);
  void set_learning_rates(int64_t s);
  void densify(int64_t s, GaussianStepResult& result);
  void install_rows(const std::vector<torch::Tensor>& rows, bool with_state);
  // Drops the trainer's references to its rows (parameters and their gradients, Adam moments,
  // statistics) while a rebalance moves them; install_rows puts the moved rows back.
  void release_rows();
  // Drops the last step's gradients (Adam has applied them; the next step starts from none), so
  // that an evaluation or an export holds the parameters and Adam state plus its own work, not
  // the step's whole state: on 10M Gaussians over 4 ranks the end-of-run eval peaked at 1,253
  // bytes per Gaussian with them, above the step's 1,072.
  void release_gradients();

  distributed::Communicator& comm_;
  const data::SceneReader& scene_;
  GaussianTrainerOptions options_;
  GaussianTrainerOptions planned_;  // the options as constructed: set_total_steps scales these
  GaussianParams params_;
  torch::Tensor ids_;  // [n] int64
  std::unique_ptr<torch::optim::Adam> optimizer_;
  PhaseTimer phases_;  // the step's phases (GaussianStepResult::phases)
  DensifyStats stats_;
  std::vector<int64_t> train_views_;
  torch::Tensor background_;  // [3] float32
  double extent_ = 0;
  int64_t next_id_ = 0;     // the next global id to assign, identical on every rank
  int64_t steps_done_ = 0;  // steps taken, skipped ones included
  int64_t adam_steps_ = 0;  // optimizer updates taken (the Adam step count of every row)
  // The densify statistics before the step in progress (forward_backward to apply_step), put
  // back when the step is skipped; undefined when the step gathers none.
  DensifyStats stats_before_step_;
  std::map<std::pair<int64_t, double>, torch::Tensor> targets_;  // (camera, scale) -> image
  SamplingSchedule sampling_;
  mutable std::vector<ViewEpoch> epochs_;
};

// The Gaussians of a Gaussian-run snapshot written at any world size, in canonical order
// (ascending global id, as canonical_params and export_ply), on the CPU; needs no MPI. Every
// checksum read is verified. UserError for a missing, damaged or non-Gaussian snapshot. `step`,
// when given, receives the snapshot's step.
GaussianParams read_snapshot_params(const std::string& path, int64_t* step = nullptr);

}  // namespace tessera::models::gaussians
