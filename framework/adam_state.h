// Replicated parameters and their Adam state in a snapshot, for families whose parameters are the
// same on every rank (replicated, not sharded): each parameter under
// snapshot_param(name), its moments and step count under snapshot_optimizer(name, ...)
// (docs/formats.md).
#pragma once

#include <torch/optim.h>
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "framework/memory.h"
#include "framework/snapshot.h"

namespace tessera {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes every parameter and its Adam state (zeros and step 0 before the first update).
void write_adam_params(SnapshotWriter& writer, const NamedParams& params, torch::optim::Adam& adam);

// Reads them back into `params` and `adam`. UserError naming the snapshot and the parameter when
// one is missing or has another shape; `settings` names where the model's sizes are set (e.g.
// "the [<family>] keys"), for that message.
void read_adam_params(const SnapshotReader& reader, const NamedParams& params,
                      torch::optim::Adam& adam, const std::string& settings);

// The bytes of Adam's parameters, their gradients (one per parameter that requires grad, held
// during each step) and its moments on this rank: "parameters", "gradients", "optimizer (Adam)"
// (ModelFamily::memory_parts). Before Adam's first step, the two moments that step allocates.
MemoryParts adam_memory_parts(torch::optim::Adam& adam);

}  // namespace tessera
