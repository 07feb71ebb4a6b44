// The NeRF model families (nerf-hash, nerf-mlp) for the family registry: each a ray Model
// (models/nerf/ray_model.h) trained by the ray family, models/nerf/ray_trainer.h.
#pragma once

#include "framework/bench_util.h"
#include "framework/config.h"
#include "framework/family.h"
#include "models/nerf/ray_model.h"
#include "models/nerf/ray_trainer.h"

namespace tessera::models::nerf {

// The ray family's options from a resolved config: the run's ([train], [eval], [snapshot]), the
// batch, the learning-rate and sampling schedules, Adam and the gradient-sync buckets.
RayTrainerOptions trainer_options(const Config& config);

// The ray models by name, for code that builds a Model directly (tests, `bench nerf`).
void register_nerf_models(ModelRegistry& registry);
// nerf-hash and nerf-mlp as model families.
void register_nerf_families(FamilyRegistry& registry);
// `tessera bench nerf` (nerf_bench.cpp): throughput, checkpoint policies, accumulation.
bench::BenchCommand add_nerf_bench(CLI::App& bench);

}  // namespace tessera::models::nerf
