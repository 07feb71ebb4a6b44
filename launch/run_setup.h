// What `tessera train`, `eval` and `render` share: the Trainer's options from a resolved config,
// and a run rebuilt from a snapshot (its stored config, the dataset, the model, its state).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/process_context.h"
#include "framework/config.h"
#include "framework/data/scene.h"
#include "framework/model.h"
#include "framework/trainer.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::launch {

// The Trainer's options from the resolved config. The schedules check their own combinations
// (e.g. rate_min <= rate_max) when built.
TrainerOptions trainer_options(const Config& config);
// The [sampling] schedule (rays per epoch for NeRF, views per epoch for `gaussians`).
SamplingScheduleOptions sampling_options(const Config& config);

// A run restored from a snapshot for eval and render: the snapshot's own config (with
// `overrides` applied, e.g. data.path when the dataset moved), on every rank. A NeRF run has
// `model` and `trainer`, a Gaussian run `gaussians`.
struct RestoredRun {
  Config config;
  std::unique_ptr<data::SceneReader> scene;
  std::unique_ptr<distributed::ProcessContext> context;
  std::unique_ptr<distributed::Communicator> comm;
  std::unique_ptr<Model> model;      // NeRF runs
  std::unique_ptr<Trainer> trainer;  // NeRF runs
  std::unique_ptr<models::gaussians::GaussianTrainer> gaussians;  // model.name = "gaussians"
  int64_t step = 0;
  // Members are destroyed in reverse order: the trainers before the communicator and context.
};

// Checks the snapshot and its dataset before MPI starts (UserError, exit code 2), then starts the
// ranks and restores the model. Collective once MPI is up.
RestoredRun restore_run(const std::string& snapshot, const std::vector<std::string>& overrides);

}  // namespace tessera::launch
