// Pieces of the TrainingRun (framework/run.h) kept apart for tests and tools: the agreed
// SIGTERM/SIGINT stop, metrics.jsonl kept up to a resumed step, snapshot writing and checks.
#pragma once

#include <signal.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

#include "distributed/communicator.h"
#include "framework/snapshot.h"

namespace tessera {

// Exit code of `tessera train` stopped by a signal after writing its stop snapshot: not
// 0, so that a scheduler does not count the job as completed (launch/slurm.sbatch requeues on it
// near the time limit). The other codes are in distributed/errors.h.
constexpr int kExitStopped = 4;

// SIGTERM, SIGINT or SIGUSR1 (a scheduler's time limit, Ctrl-C, a signal that mpirun forwards at
// once where it delays SIGTERM: docs/clusters.md) asks every rank to stop: the handler only
// sets a flag, the ranks agree on it before the first step and after each step (agree_stop), then
// all write one snapshot and return together. Installs the handlers for its lifetime and restores
// the previous ones. Nested: `tessera train` installs one before MPI starts, so that a signal
// during start-up, resume or a snapshot write is kept for the first agreement instead of killing
// one rank; only the outermost one clears the flag.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
  struct sigaction old_usr1_ {};
};

// The signal this process received since the last StopSignals was installed (0: none).
int stop_signal();
// Whether any rank received a stop signal: one scalar allreduce (max). Collective.
bool agree_stop(distributed::Communicator& comm);
// After a stop by signal: rank 0 prints "stopped by a signal after step N; snapshot S; continue
// with --resume auto" on stderr (plus `hint` when not empty); every rank logs a warning.
void report_stopped_by_signal(int rank, int64_t done, const std::string& snapshot,
                              const std::string& hint = "");

// RUN_DIR/metrics.jsonl opened for writing on rank 0 (a closed stream on other ranks and when
// out_dir is ""). A fresh run (resumed_step = 0) starts a fresh file; a resumed one keeps the
// records whose "step" is <= resumed_step and drops later ones (written after that snapshot by
// the run that died) and every other line (summaries). UserError when it cannot be written.
std::ofstream open_metrics_log(const std::string& out_dir, int rank, int64_t resumed_step);

// RUN_DIR/snapshots.
std::string run_snapshot_dir(const std::string& out_dir);
// Whether a run writes a snapshot after step `done` (1-based count of steps done): on a stop by
// signal, at the step it stops at (`until`: --until or train.steps) and every `every` steps.
bool snapshot_due(int64_t done, int64_t until, int64_t every, bool stopped_by_signal);
// Writes the snapshot of step `step` to RUN_DIR/snapshots/step-NNNNNNNN.h5: rank 0 creates the
// folder, all ranks meet, `write(path)` runs on every rank (it writes the file collectively,
// atomically), then rank 0 keeps the newest `keep` (0: all) and logs what it removed. Returns the
// path. Collective.
std::string write_run_snapshot(distributed::Communicator& comm, const std::string& out_dir,
                               int64_t step, int64_t keep,
                               const std::function<void(const std::string& path)>& write);

// Throws UserError unless the snapshot `meta` (read from `path`) belongs to this run: the same
// model, the same dataset (fingerprint `dataset_fingerprint`), and a step within train.steps.
void check_snapshot_matches_run(const std::string& path, const SnapshotMeta& meta,
                                const std::string& model, const std::string& dataset_fingerprint,
                                int64_t steps);

}  // namespace tessera
