// [gaussians]: the config section of the 3DGS family, GaussianConfig, and its schema.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/config_schema.h"
#include "kernels/tile_binning.h"
#include "models/gaussians/densify.h"
#include "models/gaussians/gaussian_loss.h"
#include "models/gaussians/gaussian_params.h"
#include "models/gaussians/stereo_init.h"

namespace tessera::models::gaussians {

// How the image tiles of a step's views are split across ranks (partition_tiles' cost).
enum class TileCostKind {
  Intersections,  // allreduced per-tile (tile, Gaussian) intersection counts of the step's views
  Uniform,        // every tile costs 1: an even split by tile count
};

// The [gaussians] section: its keys (gaussian_config.cpp) are bound to these fields, and the member
// initializers below (and DensifyOptions', LearningRates') are their defaults. Steps s are 1-based
// (INRIA's `iteration`).
struct GaussianConfig {
  static constexpr const char* kSection = "gaussians";
  int64_t views_per_step = 1;  // train views per step (the view batch), drawn per epoch
  double resolution_scale = 1.0;  // >= 1: render and compare at round(W / it) x round(H / it)
  // Coarse to fine (nerfstudio's splatfacto): step t trains at resolution_scale *
  // 2^max(0, num_downscales - floor(t / resolution_schedule)); 0 downscales = always full.
  int num_downscales = 0;
  int64_t resolution_schedule = 3000;
  // Views of a batch rendered and backpropagated together (one exchange each); the gradients of
  // the passes add up to the batch's. 0: from the memory budget (checkpoint.budget_mib), or all
  // views in one pass without one. The pass size is the minimum over ranks (passes are collective).
  int64_t views_per_pass = 0;
  LearningRates rates;            // INRIA's, see gaussian_params.h
  // Multiply every learning rate by sqrt(views_per_step) (Grendel-GS and gsplat's batch rule:
  // the loss is the mean over the batch, so its gradient shrinks about 1/sqrt(B) in noise).
  bool sqrt_batch_lr_scaling = true;
  DensifyOptions densify;             // thresholds and schedule (identical on every rank)
  InitOptions init;                   // Gaussians from the scene's points, or random
  // Without points (and without init_ply): up to 3/4 of init.random_count from plane-sweep
  // stereo between the train views (stereo_init.h), the rest random. false: all random.
  bool stereo_init = true;
  StereoOptions stereo;               // its points are set from init.random_count
  std::string init_ply;               // when set: start from this INRIA-layout .ply instead
  int sh_degree_interval = 1000;      // SH degree = min(max_sh_degree, s / interval) (INRIA)
  int max_sh_degree = kMaxShDegree;
  double ssim_weight = kDefaultSsimWeight;  // loss = (1 - w) L1 + w (1 - SSIM)
  // Weight of the opacity regularizer: opacity_reg x the mean opacity over every Gaussian is added
  // to the loss (gsplat's opacity_reg, from 3DGS-MCMC). A Gaussian no train view needs, such as one
  // hidden behind a surface from every view, gets no photometric gradient and would keep its
  // opacity; under the regularizer it fades until densification prunes it. 0: none (INRIA).
  double opacity_reg = 0;
  int64_t tile_size = kernels::kDefaultTileSize;
  TileCostKind tile_cost = TileCostKind::Intersections;
  // Migrate Gaussians when max/mean over ranks of the owned count exceeds this (checked every
  // rebalance_every steps and after each densification; two small allreduces per check).
  double rebalance_threshold = 1.2;
  int64_t rebalance_every = 100;  // 0: only after densification
  bool cache_targets = true;      // keep the (resized) train images in memory once read
};

// The [gaussians] section for FamilyInfo::config_sections.
config_schema::SectionSpec gaussian_config_section();

// The opt-in framework keys a `gaussians` run reads; the others are refused when set
// (FamilyInfo::shared_keys).
std::vector<std::string> gaussian_shared_keys();

}  // namespace tessera::models::gaussians
