// Registers every model family implemented in models/ with the framework's FamilyRegistry, and
// their benches under `tessera bench`. launch/ calls this once; the framework itself never
// includes models/.
#pragma once

#include <vector>

#include "framework/bench_util.h"
#include "framework/family.h"

namespace tessera::models {

// The families `tessera train` knows by model.name.
void register_builtin_families(FamilyRegistry& registry);
// The families' `tessera bench` subcommands (nerf, gaussians, diffusion), added under `bench`.
std::vector<bench::BenchCommand> add_builtin_benches(CLI::App& bench);
// `tessera plan` (the capacity plan of the gaussians family), added under the top-level app.
bench::BenchCommand add_builtin_plan(CLI::App& app);

}  // namespace tessera::models
