// MPI start-up and tear-down, local-rank discovery, the CPU thread share and whole-job abort.
// A process that is not under mpirun or srun runs as a singleton of size 1.
#include "distributed/process_context.h"

#include <sched.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <thread>

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <spdlog/spdlog.h>

#include "distributed/errors.h"
#include "distributed/watchdog.h"

namespace tessera::distributed {

namespace {

bool read_env_int(const char* name, int* value) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  const long parsed = std::strtol(text, &end, 10);
  if (*end != '\0' || parsed < 0) return false;
  *value = static_cast<int>(parsed);
  return true;
}

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

}  // namespace

ProcessContext::ProcessContext(int* argc, char*** argv, double timeout_s) : timeout_s_(timeout_s) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    // MULTIPLE: the watchdog thread may call MPI_Abort while the main thread is inside a
    // collective.
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_mpi_ = true;
  }
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_));
  // Errors come back as codes, which MPI_CHECK turns into DistributedError with the rank.
  MPI_CHECK(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(world_, &info_.rank));
  MPI_CHECK(MPI_Comm_size(world_, &info_.size));
  set_error_rank(info_.rank);

  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, info_.rank, MPI_INFO_NULL, &node));
  int split_rank = 0;
  MPI_CHECK(MPI_Comm_rank(node, &split_rank));
  MPI_CHECK(MPI_Comm_size(node, &info_.local_size));
  MPI_CHECK(MPI_Comm_free(&node));
  if (read_env_int("OMPI_COMM_WORLD_LOCAL_RANK", &info_.local_rank)) {
    info_.local_rank_source = "OMPI_COMM_WORLD_LOCAL_RANK";
  } else if (read_env_int("SLURM_LOCALID", &info_.local_rank)) {
    info_.local_rank_source = "SLURM_LOCALID";
  } else {
    info_.local_rank = split_rank;
    info_.local_rank_source = "MPI shared-memory split";
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) info_.hostname = host;

  watchdog_ = std::make_unique<Watchdog>(timeout_s_);
}

ProcessContext::~ProcessContext() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // While an exception unwinds, peers may be waiting in a collective for this rank: finalizing
  // would wait for them forever. The handler that catches it aborts the job instead.
  if (finalized || std::uncaught_exceptions() > 0) return;
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

bool ProcessContext::one_cuda_device_per_rank() const {
  return cuda_device_index() >= 0 &&
         static_cast<int>(torch::cuda::device_count()) >= info_.local_size;
}

int ProcessContext::apply_thread_share(int requested) const {
  int threads = requested;
  if (threads <= 0) {
    const int node_cores = static_cast<int>(std::thread::hardware_concurrency());
    const int mask = affinity_cores();
    // A launcher that bound this rank to a subset of cores already gave it its share.
    if (mask > 0 && node_cores > 0 && mask < node_cores) {
      threads = mask;
    } else {
      threads = std::max(1, std::max(node_cores, mask) / std::max(1, info_.local_size));
    }
  }
  torch::set_num_threads(threads);
  return threads;
}

void ProcessContext::abort_job(int exit_code, const std::string& message) {
  const std::string line = "tessera: rank " + std::to_string(error_rank()) + ": " + message;
  if (auto logger = spdlog::default_logger()) {
    logger->critical("{}", message);
    logger->flush();
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace tessera::distributed
