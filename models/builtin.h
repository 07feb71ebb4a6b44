// Registers every model implemented in models/ with the framework's ModelRegistry.
// launch/ calls this once; the framework itself never includes models/.
#pragma once

#include "framework/model.h"

namespace tessera::models {

void register_builtin_models(ModelRegistry& registry);

}  // namespace tessera::models
