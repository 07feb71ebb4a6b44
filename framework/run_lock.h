// RUN_DIR/run.lock: one training job per run directory, and one run directory for all nodes.
#pragma once

#include <string>

#include "distributed/process_context.h"

namespace tessera {

// Taken by `tessera train` after the ranks are up and before anything is written to RUN_DIR.
// Collective; every rank throws the same UserError when:
// - another process holds the lock: a job still running on this run directory (the message
//   names its host, pid, Slurm job id and start time). The lock is an fcntl lock that the kernel
//   (or the NFS server) drops when its process ends, however it ends, so a crashed or killed job
//   leaves nothing to clean up;
// - a rank does not find the file rank 0 just wrote: RUN_DIR is not the same directory on every
//   node (a relative run.out_dir under another working directory, a node-local path), so resume
//   would silently start at step 0 on part of the job.
// Held until destruction (rank 0); the file stays, holding the last holder's description.
class RunDirLock {
 public:
  RunDirLock(distributed::ProcessContext& context, const std::string& out_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  // RUN_DIR/run.lock.
  static std::string path(const std::string& out_dir);

 private:
  int fd_ = -1;
};

}  // namespace tessera
