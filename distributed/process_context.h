// The control plane: MPI start-up, rank discovery, local rank and device choice, CPU thread share,
// and whole-job abort (docs/distributed.md). One per process; the communicators borrow it.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace tessera::distributed {

class Heartbeat;
class Watchdog;

struct ProcessInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes on this node
  int local_size = 1;  // processes on this node
  std::string local_rank_source;  // "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID" or "MPI shared-memory split"
  // Set when the launcher's local ranks on this node are not 0..local_size-1 (a launcher that
  // sees nodes differently from MPI): the split's rank was used instead; says what was seen.
  std::string local_rank_warning;
  std::string hostname;
  int mask_cores = 0;    // cores in this rank's CPU affinity mask (its launcher's binding, cpuset)
  int mask_sharers = 1;  // ranks on this node whose masks overlap this one's (this one included)
};

class ProcessContext {
 public:
  // Initializes MPI (a plain run without mpirun is a singleton of size 1), installs error
  // handlers that return codes instead of aborting, and discovers the local rank.
  // `timeout_s` bounds every collective; past it the job is aborted with exit code 3.
  // `heartbeat_s` > 0 starts the heartbeat ring (distributed/heartbeat.h): a rank silent that
  // long ends the job with exit code 3.
  ProcessContext(int* argc, char*** argv, double timeout_s, double heartbeat_s = 0.0);
  ~ProcessContext();  // finalizes MPI if this object initialized it
  ProcessContext(const ProcessContext&) = delete;
  ProcessContext& operator=(const ProcessContext&) = delete;

  const ProcessInfo& info() const { return info_; }
  int rank() const { return info_.rank; }
  int size() const { return info_.size; }
  MPI_Comm world() const { return world_; }
  double timeout_s() const { return timeout_s_; }
  Watchdog& watchdog() { return *watchdog_; }

  // The CUDA device for this rank (local_rank modulo visible devices), or -1 without CUDA.
  int cuda_device_index() const;
  // True when every rank on this node has a CUDA device of its own (NCCL refuses two ranks on one
  // device): decided at start from the devices' PCI bus ids, so that one GPU per rank also holds
  // when each rank sees only its own (`srun --gpus-per-task=1`, a per-rank CUDA_VISIBLE_DEVICES).
  // When GPUs are visible but shared, cuda_warning() says so and the ranks run on the CPU.
  bool one_cuda_device_per_rank() const { return one_device_per_rank_; }
  const std::string& cuda_warning() const { return cuda_warning_; }
  // Set when the heartbeat was asked for but UDP between the ranks did not get through.
  const std::string& heartbeat_warning() const;
  // Sets torch's intra-op threads: `requested` if > 0, else thread_share(info().mask_cores,
  // info().mask_sharers). Returns the count set.
  int apply_thread_share(int requested) const;
  // A rank's share of its CPU mask: the mask's cores divided by the ranks on its node whose masks
  // overlap it, at least 1. So ranks x threads stays within a node's cores whatever the launcher
  // bound: no binding, a core each, a socket shared by several, a Slurm step's cpuset.
  static int thread_share(int mask_cores, int mask_sharers);
  // Whether the ranks of a node each have a GPU of their own, from the PCI bus id of the device
  // each would take (empty: none): all present and all different. Ranks that each see only
  // their own GPU (`srun --gpus-per-task=1`) all take index 0, of different devices.
  static bool one_device_each(std::vector<std::string> bus_ids);

  // Ends every process of the job with `exit_code` after printing `message` tagged with the
  // rank. Safe to call from any thread; never returns.
  [[noreturn]] static void abort_job(int exit_code, const std::string& message);

 private:
  ProcessInfo info_;
  MPI_Comm world_ = MPI_COMM_NULL;
  double timeout_s_;
  bool owns_mpi_ = false;
  bool one_device_per_rank_ = false;
  std::string cuda_warning_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<Heartbeat> heartbeat_;  // after watchdog_: destroyed first, it uses it
};

}  // namespace tessera::distributed
