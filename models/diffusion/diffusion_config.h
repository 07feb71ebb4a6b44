// [diffusion]: the config section of the point-cloud diffusion family (model `point-diffusion`,
// docs/diffusion.md). The member initializers are the keys' defaults; diffusion_config.cpp binds
// each key to a field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/config_schema.h"

namespace tessera::models::diffusion {

struct DiffusionConfig {
  static constexpr const char* kSection = "diffusion";
  // The denoiser: a transformer over point tokens (Point-E), each token one point's xyz and rgb.
  int64_t width = 128;
  int64_t depth = 4;
  int64_t heads = 4;
  int64_t tokens = 1024;  // points per shape the model sees (the first `tokens` of the dataset's)
  double dropout = 0.0;
  // DDPM: `timesteps` noise levels of the cosine schedule (Nichol & Dhariwal).
  int64_t timesteps = 1000;
  // The batch and the optimizer.
  int64_t batch = 16;  // shapes per step, split across ranks
  int64_t micro_batches = 1;
  int64_t unit_shapes = 0;  // run.deterministic: shapes per work unit; 0 = max(4, batch / 16)
  double lr = 3e-4;
  std::string lr_schedule = "cosine";
  double final_lr = 3e-5;
  int64_t warmup_steps = 100;
  double adam_eps = 1e-8;
  // Sampling (`tessera sample`, and eval's generative metrics).
  std::string sampler = "ddpm";  // DDIM's deterministic samples of small models are smoother
  int64_t sample_steps = 50;
  bool generative_eval = true;
};

// The [diffusion] section for FamilyInfo::config_sections.
config_schema::SectionSpec diffusion_config_section();

// The opt-in framework keys a point-diffusion run reads (FamilyInfo::shared_keys).
std::vector<std::string> diffusion_shared_keys();

// Checks across keys (width divisible by heads, ...); UserError naming the keys.
void check_diffusion_options(const DiffusionConfig& options, const std::string& origin);

}  // namespace tessera::models::diffusion
