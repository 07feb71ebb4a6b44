// The list of built-in models. Each models/<family>/ adds its factories here by name
// (hash-grid and MLP NeRF in models/nerf/, 3D Gaussians in models/gaussians/).
#include "models/builtin.h"

namespace tessera::models {

void register_builtin_models(ModelRegistry& registry) {
  // No model family has landed yet; the NeRF and Gaussian issues register theirs here.
  (void)registry;
}

}  // namespace tessera::models
