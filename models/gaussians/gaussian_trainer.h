// Sharded 3DGS training in the manner of Grendel-GS (DESIGN.md §3): Gaussians owned by ranks,
// image tiles split across ranks, projected attributes exchanged by all-to-all-v, Adam local.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/gaussian_sharding.h"
#include "framework/data/scene.h"
#include "framework/memory.h"
#include "kernels/tile_binning.h"
#include "models/gaussians/densify.h"
#include "models/gaussians/gaussian_loss.h"
#include "models/gaussians/gaussian_params.h"

namespace tessera::models::gaussians {

// How the image tiles of a step's views are split across ranks (partition_tiles' cost).
enum class TileCostKind {
  Intersections,  // allreduced per-tile (tile, Gaussian) intersection counts of the step's views
  Uniform,        // every tile costs 1: an even split by tile count
};

// Every knob of the sharded training step, with its default. `t` below is the 0-based step index
// passed to step(); s = t + 1 is the 1-based number of the step (INRIA's `iteration`) that the
// schedules (learning rate, densification, SH degree) see.
struct GaussianTrainerOptions {
  int64_t views_per_step = 1;  // train views per step (the view batch), drawn per epoch
  int64_t steps = 30000;       // planned steps (for callers' loops; step(t) accepts any t)
  uint64_t seed = 0;           // view order; the split samples use densify.seed
  double resolution_scale = 1.0;  // >= 1: render and compare at round(W / it) x round(H / it)
  LearningRates rates;            // INRIA's, see gaussian_params.h
  // Multiply every learning rate by sqrt(views_per_step) (Grendel-GS and gsplat's batch rule:
  // the loss is the mean over the batch, so its gradient shrinks about 1/sqrt(B) in noise).
  bool sqrt_batch_lr_scaling = true;
  DensifyOptions densify;             // thresholds and schedule (identical on every rank)
  InitOptions init;                   // Gaussians from the scene's points, or random
  int sh_degree_interval = 1000;      // SH degree = min(max_sh_degree, s / interval) (INRIA)
  int max_sh_degree = kMaxShDegree;
  double ssim_weight = kDefaultSsimWeight;  // loss = (1 - w) L1 + w (1 - SSIM)
  int64_t tile_size = kernels::kDefaultTileSize;
  TileCostKind tile_cost = TileCostKind::Intersections;
  // Migrate Gaussians when max/mean over ranks of the owned count exceeds this (checked every
  // rebalance_every steps and after each densification; two small allreduces per check).
  double rebalance_threshold = 1.2;
  int64_t rebalance_every = 100;  // 0: only after densification
  bool cache_targets = true;      // keep the (resized) train images in memory once read
};

struct GaussianStepResult {
  double loss = 0;                  // mean photometric loss over the batch, same on every rank
  std::vector<int64_t> views;       // camera indices of the batch
  int sh_degree = 0;
  bool densified = false, opacity_reset = false, rebalanced = false;
  int64_t cloned = 0, split = 0, pruned = 0;  // global counts of this step's densification
  int64_t global_count = 0;                   // Gaussians after the step
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

  // One training step on the batch batch_views(t). Collective.
  GaussianStepResult step(int64_t t);

  // The camera indices of step t's views: a pure function of (seed, t). The train views are
  // visited in epochs; epoch e is the permutation that sorts them by hash(seed, e, view).
  std::vector<int64_t> batch_views(int64_t t) const;
  int sh_degree_at(int64_t t) const;  // active SH degree of step t

  // Renders camera `camera_index` with the sharded pipeline (no gradient) at the active SH
  // degree; the full image [H, W, 3] on every rank. Collective.
  torch::Tensor render(int64_t camera_index);

  // Canonical (ordered by global id) views for tests and export. root < 0: on every rank;
  // otherwise on root only (undefined tensors elsewhere). Collective.
  GaussianParams canonical_params(int root = -1);
  std::array<torch::Tensor, 6> canonical_grads(int root = -1);  // zeros where no gradient
  torch::Tensor canonical_ids(int root = -1);                   // [N] int64 ascending
  void export_ply(const std::string& path);  // rank 0 writes the canonical set

  // Migrates to Morton ownership when the imbalance exceeds the threshold (or when forced),
  // carrying the Adam moments and densify statistics. Collective.
  distributed::RebalanceReport rebalance(bool force);

  int64_t local_count() const { return params_.size(); }
  int64_t global_count();  // collective
  const GaussianParams& local_params() const { return params_; }
  const torch::Tensor& global_ids() const { return ids_; }  // [n] int64, row i's global id
  int64_t next_global_id() const { return next_id_; }
  double extent() const { return extent_; }
  MemoryStats memory() const;  // this rank's memory (peak since start / last reset_peak)
  torch::optim::Adam& optimizer() { return *optimizer_; }
  const GaussianTrainerOptions& options() const { return options_; }

 private:
  // What step() needs from forward() per view: the owner's projection outputs.
  struct Batch {
    std::vector<torch::Tensor> radii;    // per view [n] int32
    std::vector<torch::Tensor> means2d;  // per view [n, 2], retain_grad() called when training
    std::vector<int64_t> widths, heights;
    torch::Tensor received;              // [R, 10] the exchanged rows (the backward hook)
  };
  // Renders the views with the sharded pipeline: per view, the full image on every rank.
  std::vector<torch::Tensor> forward(const std::vector<int64_t>& views, int sh_degree, bool grad,
                                     Batch* batch);
  torch::Tensor target(int64_t camera_index);
  void set_learning_rates(int64_t s);
  void densify(int64_t s, GaussianStepResult& result);
  void install_rows(const std::vector<torch::Tensor>& rows, bool with_state);

  distributed::Communicator& comm_;
  const data::SceneReader& scene_;
  GaussianTrainerOptions options_;
  GaussianParams params_;
  torch::Tensor ids_;  // [n] int64
  std::unique_ptr<torch::optim::Adam> optimizer_;
  DensifyStats stats_;
  std::vector<int64_t> train_views_;
  torch::Tensor background_;  // [3] float32
  double extent_ = 0;
  int64_t next_id_ = 0;     // the next global id to assign, identical on every rank
  int64_t adam_steps_ = 0;  // optimizer steps taken (the Adam step count of every row)
  std::map<int64_t, torch::Tensor> targets_;
};

}  // namespace tessera::models::gaussians
