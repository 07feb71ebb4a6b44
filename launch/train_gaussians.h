// `tessera train` for model.name = "gaussians" (3DGS, sharded across ranks): see
// launch/train_gaussians.cpp. Snapshots, --resume and --until work as for NeRF runs.
#pragma once

#include <cstdint>
#include <string>

#include "distributed/communicator.h"
#include "distributed/process_context.h"
#include "framework/config.h"
#include "framework/data/scene.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::launch {

constexpr const char* kGaussiansModel = "gaussians";

// What `tessera train` passes on besides the config.
struct GaussianRunOptions {
  std::string config_toml;  // the resolved config, stored in every snapshot
  std::string resume;       // a snapshot to continue from (--resume, "auto" resolved); "" = none
  int64_t until = -1;       // stop after this step with a snapshot (--until); -1 = train.steps
};

// The sharded trainer's options from the resolved config ([model] 3DGS keys, [sampling] as views
// per epoch, [checkpoint] budget as the views-per-pass budget). UserError for a budget policy
// without a budget.
models::gaussians::GaussianTrainerOptions gaussian_trainer_options(const Config& config);

// Trains on every rank (collective) and writes RUN_DIR/metrics.jsonl, renders/, snapshots/ and,
// when all train.steps are done, gaussians.ply. SIGTERM/SIGINT: a snapshot, then exit code 0.
int run_gaussian_train(const Config& config, const GaussianRunOptions& run,
                       distributed::ProcessContext& context, distributed::Communicator& comm,
                       const data::SceneReader& scene);

}  // namespace tessera::launch
