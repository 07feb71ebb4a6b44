// Adaptive density control of 3DGS (INRIA's recipe): per-view statistics, clone, split, prune
// and opacity reset, editing the parameters and the Adam state together.
#pragma once

#include <torch/optim.h>
#include <torch/types.h>

#include <cstdint>

#include "models/gaussians/gaussian_params.h"

namespace tessera::models::gaussians {

// Every threshold of the recipe; defaults are INRIA 3DGS's. `step` below is the 1-based number
// of the optimizer step just taken (INRIA's `iteration`).
struct DensifyOptions {
  double grad_threshold = 2e-4;   // mean NDC-scaled screen gradient norm that densifies
  double percent_dense = 0.01;    // x extent: max scale at or below it clones, above it splits
  int64_t densify_from = 500;     // densify when step > densify_from ...
  int64_t densify_until = 15000;  // ... and step < densify_until (statistics likewise) ...
  int64_t densify_every = 100;    // ... and step % densify_every == 0
  int64_t opacity_reset_every = 3000;  // opacity reset when step % it == 0 (step < until)
  double prune_opacity = 0.005;   // prune when sigmoid(opacity logit) < this
  // Too-large pruning, only when step > opacity_reset_every (after the first reset):
  double max_screen_radius = 20;  // pixels, the largest radius seen since the last densify
  double max_world_scale = 0.1;   // x extent, the largest of the three scales
  int64_t split_children = 2;     // children per split Gaussian (the parent is removed)
  double split_scale_divisor = 1.6;  // child scale = parent scale / (0.8 x children)
  double reset_opacity = 0.01;    // opacity reset: opacity = min(opacity, this)
  uint64_t seed = 0;              // split samples: see densify_and_prune
};

bool accumulates_stats(const DensifyOptions& options, int64_t step);
bool densifies(const DensifyOptions& options, int64_t step);
bool resets_opacity(const DensifyOptions& options, int64_t step);

// Per-Gaussian statistics since the last densification, accumulated once per rendered view.
struct DensifyStats {
  torch::Tensor grad_norm_sum;  // [N] float32, sum of densify_grad_norm over views where visible
  torch::Tensor count;          // [N] int32,   views where visible (radii > 0)
  torch::Tensor max_radii;      // [N] int32,   largest radius seen

  void reset(int64_t n, torch::Device device = torch::kCPU);
  // One view. v_means2d = RenderOutput::means2d.grad() (zeros or undefined: counted, adds 0).
  void accumulate(const torch::Tensor& radii,      // [N] int32
                  const torch::Tensor& v_means2d,  // [N, 2]
                  int64_t width, int64_t height);
  torch::Tensor mean_grad() const;  // [N] grad_norm_sum / count, 0 where count == 0
};

struct DensifyResult {
  int64_t cloned = 0, split = 0, pruned = 0;  // pruned counts removed rows (not split parents)
  int64_t before = 0, after = 0;
  // Provenance of the result rows (CPU int64), for callers that track identities (the sharded
  // trainer assigns global ids to new rows from it):
  torch::Tensor origin;  // [after] the row (before the call) each row was kept from or copies
  torch::Tensor child;   // [after] -1 kept original, 0 clone, c the c-th child of a split
};

// The Adam-state surgery under every operation. The new params are, in order, the rows `keep`
// of the current ones, then the rows of `extra` (if given). Every tensor is replaced by a new
// leaf that requires grad; in `optimizer` (if given) the param is swapped in its group and its
// state moved to the new tensor: exp_avg, exp_avg_sq (and max_exp_avg_sq) rows of kept Gaussians
// are copied, rows of `extra` are zero, and the step count is kept (INRIA's
// cat_tensors_to_optimizer / _prune_optimizer). A param without state yet gets none.
void remap_gaussians(GaussianParams& params, torch::optim::Adam* optimizer,
                     const torch::Tensor& keep,            // [K] int64 row indices
                     const GaussianParams* extra = nullptr);  // M rows, any requires_grad

// Removes the rows where `prune` is true (the optimizer state follows).
void prune_gaussians(GaussianParams& params, torch::optim::Adam* optimizer,
                     const torch::Tensor& prune);  // [N] bool

// opacity = min(opacity, options.reset_opacity) through the logit; the opacity Adam moments are
// zeroed (the step count kept), as INRIA's reset_opacity / replace_tensor_to_optimizer.
void reset_opacity(GaussianParams& params, torch::optim::Adam* optimizer,
                   const DensifyOptions& options);

// INRIA's densify_and_prune on the statistics: g = stats.mean_grad(), s = max scale.
//   clone: g >= grad_threshold and s <= percent_dense x extent  (a copy is appended)
//   split: g >= grad_threshold and s >  percent_dense x extent  (split_children children are
//          appended, the parent removed): child c of Gaussian i has mean = mean_i + R_i z,
//          z_a = scale_i,a x normal(hash(seed, "split", step, ids[i], c, a)), scales divided by
//          split_scale_divisor, every other attribute copied.
//   prune: opacity < prune_opacity, and when step > opacity_reset_every also max radius >
//          max_screen_radius or s > max_world_scale x extent; applied to the originals, clones
//          and children alike (new rows have max radius 0: not yet seen).
// The result's rows: kept originals, kept clones, kept children (children child-major: every
// first child, then every second child), each group in ascending row order. `stats` is reset
// to the new size.
// `ids` [N] int64 is each Gaussian's identity: its row in the canonical global order (the order
// a single-process run holds them in); undefined means the row index. A split's children are a
// pure function of (seed, step, id, child, axis), never of the call order or of the rank, so a
// sharded run that passes the canonical ids reproduces the single-process decisions.
DensifyResult densify_and_prune(GaussianParams& params, torch::optim::Adam* optimizer,
                                DensifyStats& stats, const DensifyOptions& options,
                                double extent, int64_t step,
                                const torch::Tensor& ids = {});  // [N] int64 or undefined

// The rotation matrices of quaternions (w, x, y, z), normalized first.
torch::Tensor quat_to_rotmat(const torch::Tensor& quats);  // [N, 4] -> [N, 3, 3]

}  // namespace tessera::models::gaussians
