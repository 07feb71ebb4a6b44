// The list of built-in model families (one line per family folder of models/) and their benches.
#include "models/builtin.h"

#include "models/diffusion/diffusion_family.h"
#include "models/gaussians/gaussian_family.h"
#include "models/gaussians/gaussian_plan.h"
#include "models/nerf/nerf_family.h"

namespace tessera::models {

void register_builtin_families(FamilyRegistry& registry) {
  nerf::register_nerf_families(registry);           // nerf-hash, nerf-mlp (models/nerf/)
  gaussians::register_gaussian_family(registry);    // gaussians (models/gaussians/)
  diffusion::register_diffusion_family(registry);   // point-diffusion (models/diffusion/)
  registry.set_default_model("nerf-hash");  // what a config without model.name trains
}

std::vector<bench::BenchCommand> add_builtin_benches(CLI::App& bench) {
  return {nerf::add_nerf_bench(bench), gaussians::add_gaussian_bench(bench),
          gaussians::add_gaussian_snapshot_bench(bench), diffusion::add_diffusion_bench(bench)};
}

bench::BenchCommand add_builtin_plan(CLI::App& app) {
  return gaussians::add_plan_command(app, register_builtin_families);
}

}  // namespace tessera::models
