// MPI start-up and tear-down, local-rank discovery, the CPU thread share and whole-job abort.
// A process that is not under mpirun or srun runs as a singleton of size 1.
#include "distributed/process_context.h"

#include <sched.h>
#include <unistd.h>

#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <iostream>
#include <thread>
#include <utility>
#include <vector>

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <spdlog/spdlog.h>

#include "distributed/errors.h"
#include "distributed/heartbeat.h"
#include "distributed/watchdog.h"

namespace tessera::distributed {

namespace {

// How long abort_job waits for MPI_Abort to end this process before ending it itself.
constexpr double kAbortGraceS = 5.0;

bool read_env_int(const char* name, int* value) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  const long parsed = std::strtol(text, &end, 10);
  if (*end != '\0' || parsed < 0) return false;
  *value = static_cast<int>(parsed);
  return true;
}

cpu_set_t affinity_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int c = 0; c < cores && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  }
  return set;
}

// The launcher's local rank, if it gives one: (value, variable name).
std::pair<int, std::string> launcher_local_rank() {
  int value = -1;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"})
    if (read_env_int(name, &value)) return {value, name};
  return {-1, ""};
}

}  // namespace

ProcessContext::ProcessContext(int* argc, char*** argv, double timeout_s, double heartbeat_s)
    : timeout_s_(timeout_s) {
  // First, so that start-up cannot hang: MPI's first traffic between hosts (a wrong network
  // interface, a node that is gone) ends the job after `timeout_s` like any collective.
  watchdog_ = std::make_unique<Watchdog>(timeout_s_);
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    // MULTIPLE: the watchdog thread may call MPI_Abort while the main thread is inside a
    // collective.
    Watchdog::Scope watch(*watchdog_, "MPI_Init (reaching the launcher and the other ranks)");
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_mpi_ = true;
  }
  Watchdog::Scope watch(*watchdog_, "start-up: duplicating MPI_COMM_WORLD, finding the ranks of this node");
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_));
  // Errors come back as codes, which MPI_CHECK turns into DistributedError with the rank.
  MPI_CHECK(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(world_, &info_.rank));
  MPI_CHECK(MPI_Comm_size(world_, &info_.size));
  set_error_rank(info_.rank);
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) info_.hostname = host;

  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, info_.rank, MPI_INFO_NULL, &node));
  int split_rank = 0;
  MPI_CHECK(MPI_Comm_rank(node, &split_rank));
  MPI_CHECK(MPI_Comm_size(node, &info_.local_size));

  // The launcher's local rank, if every rank of this node has one and together they number the
  // node's ranks 0..local_size-1 (what device choice assumes); else the split's, with a warning.
  const auto [launcher_rank, launcher_source] = launcher_local_rank();
  std::vector<int> local_ranks(static_cast<size_t>(info_.local_size));
  MPI_CHECK(MPI_Allgather(&launcher_rank, 1, MPI_INT, local_ranks.data(), 1, MPI_INT, node));
  std::vector<int> sorted = local_ranks;
  std::sort(sorted.begin(), sorted.end());
  bool numbered = true;
  for (int i = 0; i < info_.local_size; ++i) numbered = numbered && sorted[i] == i;
  if (launcher_rank >= 0 && numbered) {
    info_.local_rank = launcher_rank;
    info_.local_rank_source = launcher_source;
  } else {
    info_.local_rank = split_rank;
    info_.local_rank_source = "MPI shared-memory split";
    if (launcher_rank >= 0) {
      std::string seen;
      for (const int r : local_ranks) seen += (seen.empty() ? "" : ",") + std::to_string(r);
      info_.local_rank_warning = launcher_source + " on the " + std::to_string(info_.local_size) +
                                 " ranks MPI places on " + info_.hostname + " is " + seen +
                                 ", not 0.." + std::to_string(info_.local_size - 1) +
                                 "; using MPI's numbering (local rank " +
                                 std::to_string(split_rank) + ")";
    }
  }

  // The CPU masks of this node's ranks, for the thread share.
  const cpu_set_t mask = affinity_mask();
  info_.mask_cores = CPU_COUNT(&mask);
  std::vector<cpu_set_t> masks(static_cast<size_t>(info_.local_size));
  MPI_CHECK(MPI_Allgather(&mask, sizeof(cpu_set_t), MPI_BYTE, masks.data(), sizeof(cpu_set_t),
                          MPI_BYTE, node));
  info_.mask_sharers = 0;
  for (cpu_set_t other : masks) {
    cpu_set_t both;
    CPU_AND(&both, &other, &mask);
    if (CPU_COUNT(&both) > 0) ++info_.mask_sharers;
  }

  // One CUDA device per rank: the PCI bus ids of the devices this node's ranks would take are
  // all different (ranks that see only their own GPU all take index 0 of different devices).
  char bus_id[32] = {0};
  const int device = cuda_device_index();
#ifdef TESSERA_WITH_CUDA
  if (device >= 0 && cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id) - 1, device) != cudaSuccess)
    bus_id[0] = '\0';
#endif
  std::vector<char> bus_ids(sizeof(bus_id) * static_cast<size_t>(info_.local_size));
  MPI_CHECK(MPI_Allgather(bus_id, sizeof(bus_id), MPI_CHAR, bus_ids.data(), sizeof(bus_id),
                          MPI_CHAR, node));
  std::vector<std::string> taken;
  for (int i = 0; i < info_.local_size; ++i) taken.emplace_back(&bus_ids[sizeof(bus_id) * i]);
  one_device_per_rank_ = one_device_each(std::move(taken));
  if (device >= 0 && !one_device_per_rank_)
    cuda_warning_ = std::to_string(info_.local_size) + " ranks on " + info_.hostname +
                    " share their visible GPUs (NCCL needs one GPU per rank): running on the "
                    "CPU; start one rank per GPU (srun --gpus-per-task=1, or as many ranks per "
                    "node as GPUs)";
  MPI_CHECK(MPI_Comm_free(&node));
  heartbeat_ = std::make_unique<Heartbeat>(world_, info_.hostname, heartbeat_s, *watchdog_);
}

const std::string& ProcessContext::heartbeat_warning() const { return heartbeat_->warning(); }

ProcessContext::~ProcessContext() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // While an exception unwinds, peers may be waiting in a collective for this rank: finalizing
  // would wait for them forever. The handler that catches it aborts the job instead.
  if (finalized || std::uncaught_exceptions() > 0) return;
  heartbeat_.reset();  // a clean exit: the next rank is told, not left to take it for a loss
  {
    Watchdog::Scope watch(*watchdog_, "MPI_Finalize");
    if (world_ != MPI_COMM_NULL) MPI_Comm_free(&world_);
    if (owns_mpi_) MPI_Finalize();
  }
  watchdog_.reset();
}

int ProcessContext::cuda_device_index() const {
#ifdef TESSERA_WITH_CUDA
  if (!torch::cuda::is_available()) return -1;
  const int count = static_cast<int>(torch::cuda::device_count());
  return count > 0 ? info_.local_rank % count : -1;
#else
  return -1;
#endif
}

bool ProcessContext::one_device_each(std::vector<std::string> bus_ids) {
  if (std::any_of(bus_ids.begin(), bus_ids.end(), [](const std::string& id) { return id.empty(); }))
    return false;
  std::sort(bus_ids.begin(), bus_ids.end());
  return std::adjacent_find(bus_ids.begin(), bus_ids.end()) == bus_ids.end();
}

int ProcessContext::thread_share(int mask_cores, int mask_sharers) {
  return std::max(1, mask_cores / std::max(1, mask_sharers));
}

int ProcessContext::apply_thread_share(int requested) const {
  const int threads = requested > 0 ? requested : thread_share(info_.mask_cores, info_.mask_sharers);
  torch::set_num_threads(threads);
  return threads;
}

void ProcessContext::abort_job(int exit_code, const std::string& message) {
  const std::string line = "tessera: rank " + std::to_string(error_rank()) + ": " + message;
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  // The log file is in the run directory, often on a shared filesystem, which may be what hangs
  // (a lost file server): write it from another thread and abort after at most 2 s regardless.
  if (auto logger = spdlog::default_logger()) {
    auto written = std::make_shared<std::atomic<bool>>(false);
    std::thread([logger, message, written] {
      logger->critical("{}", message);
      logger->flush();
      written->store(true);
    }).detach();
    for (int i = 0; i < 200 && !written->load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // Every rank is told directly too: MPI_Abort goes through the launcher, which a lost link may
  // have cut off from some nodes.
  Heartbeat::tell_everyone_the_job_ends();
  // MPI_Abort itself can block when the launcher is out of reach (srun behind a cut link): this
  // process ends after kAbortGraceS regardless.
  std::thread([exit_code] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceS));
    std::_Exit(exit_code);
  }).detach();
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace tessera::distributed
