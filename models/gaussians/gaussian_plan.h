// `tessera plan`: how much memory sharded 3DGS training needs per rank, and what it moves between
// ranks per step, for a scene of G Gaussians on N ranks, from per-Gaussian and per-pixel costs
// measured with `tessera bench gaussians` (docs/gaussians.md, "Capacity plan").
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "framework/bench_util.h"
#include "framework/family.h"
#include "models/gaussians/gaussian_config.h"

namespace tessera::models::gaussians {

// Measured costs (counting CPU allocator, `tessera bench gaussians` on one rank at 64 to 768
// pixels a side and 1 to 3 views per pass; docs/gaussians.md, "Capacity plan", gives the runs).
// A step peaks at one of two moments, and the plan takes the larger:
// - in the backward, where every owned Gaussian holds its parameters, their gradients and Adam
//   moments (59 floats x 4 each), its global id and densification statistics, and what each view
//   of the pass keeps for its projection and rasterizer backward; a pixel, little;
// - at the loss, before any gradient exists, where the views' images and the loss's SSIM maps
//   weigh most: it is the peak of large views.
constexpr int64_t kStateBytesPerGaussian = 4 * 59 * 4;  // parameters, gradients, 2 Adam moments
constexpr int64_t kBookkeepingBytesPerGaussian = 8 + 12;  // global id; densification statistics
constexpr int64_t kBackwardViewBytesPerGaussian = 108;    // the first view of a pass
constexpr int64_t kFurtherViewBytesPerGaussian = 111;     // each further view of a pass
constexpr int64_t kBatchedPassBytesPerGaussian = 135;     // once, for a pass of several views
constexpr int64_t kBackwardBytesPerPixel = 60;            // per view of a pass
constexpr int64_t kForwardViewBytesPerGaussian = 112;     // per view of a pass, at the loss
constexpr int64_t kForwardBytesPerPixel = 183;            // per view of a pass, at the loss
constexpr int64_t kLossBytesPerPixel = 212;               // the loss of one view at a time
// Bytes an exchanged row costs per step, summed over the link: the projected row (10 floats) and
// its side data (3 int64) to the tile owner, the row's gradient (10 floats) back.
constexpr int64_t kExchangeBytesPerRow = 40 + 24 + 40;

struct PlanRequest {
  int64_t gaussians = 0;    // G, the whole scene
  int ranks = 1;            // N
  int64_t width = 0, height = 0;  // the largest rendered view (after resolution_scale)
  int64_t train_views = 0;  // views whose targets each rank caches (gaussians.cache_targets)
  double gpu_memory_bytes = 0;  // per rank; 0 = no limit given
  // Share of the memory the allocator's peak may use; the rest is for the CUDA context, NCCL's
  // buffers and the caching allocator's fragmentation.
  double usable_fraction = 0.9;
  // Exchange model: a step's view sees this share of the Gaussians, and a visible Gaussian's
  // footprint touches this many ranks' tile blocks on average (measured 1.33-1.64, see docs).
  double visible_fraction = 1.0;
  double ranks_touched = 1.5;
  // checkpoint.policy = "budget": the per-rank budget that sets the views per pass when
  // gaussians.views_per_pass is 0, as the trainer sets them (0 = no budget).
  double budget_bytes = 0;
};

// The largest scene a plan takes: its byte counts stay far inside int64.
constexpr double kMaxPlanGaussians = 1e15;

struct CapacityPlan {
  PlanRequest request;
  int64_t views_per_pass = 1;
  int64_t views_per_step = 1;
  int sh_degree = 3;
  int64_t bytes_per_gaussian = 0;  // per owned Gaussian at the peak
  int64_t bytes_per_pixel = 0;     // per pixel of the largest view, at the peak
  bool peak_at_loss = false;       // the peak is the loss's (large views), not the backward's
  int64_t target_cache_bytes = 0;  // cached train targets, per rank
  int64_t max_gaussians_per_rank = 0;  // ceil(G / N): the Morton split balances counts
  int64_t peak_bytes_per_rank = 0;
  double peak_bytes_per_gaussian = 0;  // summed over ranks, over G
  double all_to_all_bytes_per_step = 0;  // summed over ranks
  double allreduce_bytes_per_step = 0;   // summed over ranks
  bool limited = false;      // a GPU memory was given
  bool fits = true;          // peak_bytes_per_rank <= usable memory
  int64_t max_count = 0;     // the largest scene that fits on `ranks` (limited only)
};

// The plan for `config` (a gaussians config: views per step and pass, cache_targets, SH degree).
// Throws UserError for a request it cannot plan (G < 1, N < 1, no image size, ...).
CapacityPlan plan_capacity(const GaussianConfig& config, const PlanRequest& request);

// One JSON line whose keys match `tessera bench gaussians`' (count, ranks, size,
// peak_bytes_per_rank, peak_bytes_per_gaussian, all_to_all_bytes_per_step, ...).
std::string plan_json(const CapacityPlan& plan);

// `tessera plan`, added under `app` (gaussian_plan_command.cpp); `register_families` fills the
// registry the config is checked against.
bench::BenchCommand add_plan_command(CLI::App& app,
                                     std::function<void(FamilyRegistry&)> register_families);

}  // namespace tessera::models::gaussians
