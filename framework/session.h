// Bringing a run up, for every family (docs/architecture.md): the checks that need no MPI, the
// ranks, logging, device, communicator, dataset and family; resume resolution; and a run
// restored from a snapshot for `tessera eval` and `render`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/process_context.h"
#include "framework/config.h"
#include "framework/data/dataset.h"
#include "framework/family.h"
#include "framework/run.h"
#include "framework/run_lock.h"

namespace tessera {

// A started run. Members are destroyed in reverse order: the run and the family before the
// communicator and the process context.
struct Session {
  Config config;
  std::unique_ptr<data::Dataset> dataset;  // opened by the family (FamilyInfo::open_dataset)
  std::unique_ptr<distributed::ProcessContext> context;
  std::unique_ptr<RunDirLock> lock;  // training only: RUN_DIR is this job's (framework/run_lock.h)
  std::unique_ptr<distributed::Communicator> comm;
  std::unique_ptr<ModelFamily> family;
  std::unique_ptr<TrainingRun> run;
  // The step renders and scores are taken at: the snapshot's, or train.steps for a model
  // imported from a file (a finished run).
  int64_t step = 0;
};

// What `tessera train` asks for besides the config.
struct TrainRequest {
  std::string config_path;  // for the log
  std::string resume;       // "", "auto" or a snapshot path (--resume)
  int64_t until = -1;       // stop after this step with a snapshot (--until); -1 = train.steps
};

// Everything about `config` that can be checked without MPI, so that bad input is reported once
// and no rank starts (UserError): the model name, the family's own checks, the dataset, and a
// --resume path's format.
void check_before_ranks(const Config& config, const FamilyRegistry& families,
                        const std::string& resume);

// Starts the ranks (MPI), logging to RUN_DIR/logs, the device (one GPU per rank when there are
// enough), the communicator, the dataset and the family, locks RUN_DIR for this job (refused when
// another job holds it or a rank sees another directory), and builds the TrainingRun; resolves
// and loads `request.resume`. Collective once MPI is up.
Session start_training(const Config& config, const FamilyRegistry& families,
                       const TrainRequest& request);

// The snapshot a run resumes from: `resume` itself, or for "auto" the newest snapshot in
// `snapshot_dir` that validates (damaged newer ones skipped with a warning); "" = start at step
// 0. Every rank looks; they must pick the same file (checked).
std::string resolve_resume(const std::string& resume, const std::string& snapshot_dir,
                           distributed::ProcessContext& context);

// What `eval`, `render`, `sample`, `export` and `info` take for a snapshot: a snapshot file as
// is; a run folder (RUN_DIR, or RUN_DIR/snapshots): its newest snapshot that validates (newer
// damaged ones skipped with a warning on stderr). UserError when such a folder holds none.
std::string snapshot_argument(const std::string& path);

// A run restored from a snapshot for eval and render: the snapshot's own config (with
// `overrides` applied, e.g. data.path when the dataset moved), on every rank, writing no files.
// Checks the snapshot and its dataset before MPI starts (UserError, exit code 2).
Session restore_session(const std::string& snapshot, const std::vector<std::string>& overrides,
                        const FamilyRegistry& families);

// A model trained elsewhere (e.g. an INRIA PLY), ready to render and score on the cameras of
// the dataset `scene`: the family whose FamilyInfo::import_overrides reads `file`, with its
// default config, those overrides, data.path = `scene`, then `overrides`. UserError (before MPI)
// for a missing file or dataset, or a file no family reads.
Session import_session(const std::string& file, const std::string& scene,
                       const std::vector<std::string>& overrides, const FamilyRegistry& families);

}  // namespace tessera
