// ProcessContext under mpiexec: local rank from OMPI, Slurm or the shared-memory split, the CUDA
// device choice, the CPU thread share, and agreement checks across ranks.
#include <gtest/gtest.h>

#include <sched.h>

#include <cstdlib>
#include <thread>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "tests/mpi_test_env.h"

namespace tessera::distributed {
namespace {

// Sets or clears an environment variable for one scope, restoring it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1); else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1); else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(ProcessContext, RankSizeAndLocalRankFromLauncher) {
  ProcessContext& context = *test::g_context;
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(context.rank(), rank);
  EXPECT_EQ(context.size(), size);
  EXPECT_EQ(error_rank(), rank);
  // Every rank of a CTest job runs on this one node.
  EXPECT_EQ(context.info().local_size, size);
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(context.info().local_rank_source, "OMPI_COMM_WORLD_LOCAL_RANK");
    EXPECT_EQ(context.info().local_rank, std::atoi(local));
  }
  EXPECT_FALSE(context.info().hostname.empty());
}

TEST(ProcessContext, LocalRankFromSlurmThenSharedMemorySplit) {
  const std::string mine = std::to_string(test::g_context->rank());  // one node: = world rank
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    ScopedEnv slurm("SLURM_LOCALID", mine.c_str());
    ProcessContext context(nullptr, nullptr, 60.0);
    EXPECT_EQ(context.info().local_rank_source, "SLURM_LOCALID");
    EXPECT_EQ(context.info().local_rank, context.rank());
    EXPECT_EQ(context.info().local_rank_warning, "");
  }
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    ScopedEnv slurm("SLURM_LOCALID", nullptr);
    ProcessContext context(nullptr, nullptr, 60.0);
    EXPECT_EQ(context.info().local_rank_source, "MPI shared-memory split");
    EXPECT_EQ(context.info().local_rank, context.rank());  // one node: split rank = world rank
    EXPECT_EQ(context.info().local_rank_warning, "");
  }
}

// A launcher whose local ranks do not number this node's ranks 0..n-1 (here every rank says 7)
// would put two ranks on one GPU: MPI's numbering is used instead, with a warning naming it.
TEST(ProcessContext, InconsistentLauncherLocalRankFallsBackToTheSplit) {
  ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
  ScopedEnv slurm("SLURM_LOCALID", "7");
  ProcessContext context(nullptr, nullptr, 60.0);
  EXPECT_EQ(context.info().local_rank_source, "MPI shared-memory split");
  EXPECT_EQ(context.info().local_rank, context.rank());
  const std::string& warning = context.info().local_rank_warning;
  EXPECT_NE(warning.find("SLURM_LOCALID"), std::string::npos) << warning;
  EXPECT_NE(warning.find("not 0.." + std::to_string(context.info().local_size - 1)),
            std::string::npos) << warning;
}

TEST(ProcessContext, ThreadShare) {
  ProcessContext& context = *test::g_context;
  EXPECT_EQ(context.apply_thread_share(3), 3);
  EXPECT_EQ(torch::get_num_threads(), 3);
  const ProcessInfo& info = context.info();
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  EXPECT_EQ(info.mask_cores, CPU_COUNT(&mask));
  EXPECT_GE(info.mask_sharers, 1);
  EXPECT_LE(info.mask_sharers, info.local_size);
  const int share = context.apply_thread_share(0);
  EXPECT_EQ(share, ProcessContext::thread_share(info.mask_cores, info.mask_sharers));
  EXPECT_EQ(torch::get_num_threads(), share);
  // The ranks sharing this rank's cores use no more threads than there are cores.
  if (info.mask_cores >= info.mask_sharers) {
    EXPECT_LE(share * info.mask_sharers, info.mask_cores);
  }
}

// The share for each way a launcher binds: none (every rank sees all cores), a core or a few
// each, a socket (or a Slurm step's cpuset) shared by several ranks, more ranks than cores.
TEST(ProcessContext, ThreadShareOfEachBinding) {
  EXPECT_EQ(ProcessContext::thread_share(16, 4), 4);  // no binding: 16 cores, 4 ranks
  EXPECT_EQ(ProcessContext::thread_share(4, 1), 4);    // bound to 4 cores of its own
  EXPECT_EQ(ProcessContext::thread_share(8, 2), 4);    // a socket of 8 shared by 2 ranks
  EXPECT_EQ(ProcessContext::thread_share(8, 3), 2);    // rounded down: 3 x 2 <= 8
  EXPECT_EQ(ProcessContext::thread_share(1, 2), 1);    // oversubscribed: at least one
  EXPECT_EQ(ProcessContext::thread_share(0, 0), 1);
}

// The decision behind one_cuda_device_per_rank(), from the bus ids a node's ranks would take.
TEST(ProcessContext, OneDeviceEachFromBusIds) {
  // srun --gpus-per-task=1: each rank sees one GPU, index 0, a different device each.
  EXPECT_TRUE(ProcessContext::one_device_each({"00000000:19:00.0", "00000000:3B:00.0"}));
  // Every rank sees all GPUs and takes its local rank's.
  EXPECT_TRUE(ProcessContext::one_device_each({"00000000:3B:00.0", "00000000:19:00.0", "00000000:4C:00.0"}));
  // Two ranks on the one visible GPU (more ranks than GPUs, or a per-node CUDA_VISIBLE_DEVICES).
  EXPECT_FALSE(ProcessContext::one_device_each({"00000000:19:00.0", "00000000:19:00.0"}));
  // A rank without a device (no CUDA there): the node runs on the CPU.
  EXPECT_FALSE(ProcessContext::one_device_each({"00000000:19:00.0", ""}));
  EXPECT_FALSE(ProcessContext::one_device_each({""}));
  EXPECT_TRUE(ProcessContext::one_device_each({"00000000:19:00.0"}));
}

TEST(ProcessContext, CudaDeviceFollowsLocalRank) {
  ProcessContext& context = *test::g_context;
  const int device = context.cuda_device_index();
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(device, -1);
    EXPECT_FALSE(context.one_cuda_device_per_rank());
    EXPECT_EQ(context.cuda_warning(), "");
    return;
  }
  const int count = static_cast<int>(torch::cuda::device_count());
  EXPECT_EQ(device, context.info().local_rank % count);
  // One GPU each exactly when there are as many visible as ranks on the node (CTest's ranks all
  // see every GPU); otherwise the ranks share and are told so.
  EXPECT_EQ(context.one_cuda_device_per_rank(), count >= context.info().local_size);
  EXPECT_EQ(context.cuda_warning().empty(), context.one_cuda_device_per_rank());
}

TEST(Agreement, SameValuePassesDifferentValueThrowsOnEveryRank) {
  ProcessContext& context = *test::g_context;
  EXPECT_NO_THROW(check_same_on_all_ranks(context, fingerprint("same text"), "a shared value"));
  EXPECT_NO_THROW(check_same_on_all_ranks(context, 0.25, "a shared double"));
  if (context.size() == 1) return;
  // Rank-dependent values: every rank must learn of the disagreement, not only some.
  try {
    check_same_on_all_ranks(context, static_cast<uint64_t>(context.rank()), "the rank number");
    ADD_FAILURE() << "disagreement not detected";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks disagree on the rank number"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(check_same_on_all_ranks(context, 1.0 + context.rank(), "a double"), UserError);
}

TEST(Agreement, FingerprintIsStable) {
  // FNV-1a 64 of "" and "a": the published test vectors.
  EXPECT_EQ(fingerprint(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fingerprint("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_NE(fingerprint("steps = 1"), fingerprint("steps = 2"));
}

}  // namespace
}  // namespace tessera::distributed
