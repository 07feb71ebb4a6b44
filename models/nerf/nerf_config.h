// [nerf]: the config section of the NeRF family (nerf-hash, nerf-mlp). Its member initializers
// are the keys' defaults; the schema binding each key to a field is in nerf_config.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "framework/config_schema.h"
#include "framework/schedule.h"
#include "models/nerf/nerf_hash.h"
#include "models/nerf/nerf_mlp.h"

namespace tessera::models::nerf {

struct NerfConfig {
  static constexpr const char* kSection = "nerf";
  // Both models: the batch of rays and the optimizer (docs/training.md).
  int64_t rays_per_step = 4096;
  int64_t micro_batches = 1;
  int64_t unit_rays = 0;  // run.deterministic: rays per work unit; 0 = max(256, rays_per_step / 16)
  double lr = 1e-2;
  std::string lr_schedule = "exponential";
  double final_lr = 1e-4;
  int64_t warmup_steps = 0;
  double adam_eps = 1e-15;
  std::string background = "random";
  bool pixel_jitter = false;
  // Each model's own sizes: [nerf] hash_* keys (and march_*, distortion_weight,
  // near_gradient_distance, sampler, proposal_*, interlevel_weight) set `hash`, mlp_* keys set
  // `mlp`.
  NerfHashOptions hash;
  NerfMlpOptions mlp;
};

// The [nerf] section for FamilyInfo::config_sections.
config_schema::SectionSpec nerf_config_section();

// Checks across keys that their ranges cannot express; UserError naming the keys.
void check_nerf_config(const NerfConfig& config, const std::string& origin);

}  // namespace tessera::models::nerf
