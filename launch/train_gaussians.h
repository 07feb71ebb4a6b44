// `tessera train` for model.name = "gaussians" (3DGS, sharded across ranks): see
// launch/train_gaussians.cpp. Snapshots and resume of Gaussian runs are not implemented yet.
#pragma once

#include "distributed/communicator.h"
#include "distributed/process_context.h"
#include "framework/config.h"
#include "framework/data/scene.h"

namespace tessera::launch {

constexpr const char* kGaussiansModel = "gaussians";

// Trains on every rank (collective) and writes RUN_DIR/metrics.jsonl, renders/ and gaussians.ply.
int run_gaussian_train(const Config& config, distributed::ProcessContext& context,
                       distributed::Communicator& comm, const data::SceneReader& scene);

}  // namespace tessera::launch
