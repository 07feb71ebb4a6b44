// The list of built-in models. Each models/<family>/ adds its factories here by name
// (hash-grid and MLP NeRF in models/nerf/, 3D Gaussians in models/gaussians/).
#include "models/builtin.h"

#include "models/nerf/nerf_hash.h"
#include "models/nerf/nerf_mlp.h"

namespace tessera::models {

void register_builtin_models(ModelRegistry& registry) {
  registry.add("nerf-hash", nerf::make_nerf_hash);
  registry.add("nerf-mlp", nerf::make_nerf_mlp);
}

}  // namespace tessera::models
