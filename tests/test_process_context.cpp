// ProcessContext under mpiexec: local rank from OMPI, Slurm or the shared-memory split, the CUDA
// device choice, the CPU thread share, and agreement checks across ranks.
#include <gtest/gtest.h>

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
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    ScopedEnv slurm("SLURM_LOCALID", "7");
    ProcessContext context(nullptr, nullptr, 60.0);
    EXPECT_EQ(context.info().local_rank_source, "SLURM_LOCALID");
    EXPECT_EQ(context.info().local_rank, 7);
  }
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    ScopedEnv slurm("SLURM_LOCALID", nullptr);
    ProcessContext context(nullptr, nullptr, 60.0);
    EXPECT_EQ(context.info().local_rank_source, "MPI shared-memory split");
    EXPECT_EQ(context.info().local_rank, context.rank());  // one node: split rank = world rank
  }
}

TEST(ProcessContext, ThreadShare) {
  ProcessContext& context = *test::g_context;
  EXPECT_EQ(context.apply_thread_share(3), 3);
  EXPECT_EQ(torch::get_num_threads(), 3);
  const int share = context.apply_thread_share(0);
  EXPECT_GE(share, 1);
  EXPECT_LE(share, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(torch::get_num_threads(), share);
}

TEST(ProcessContext, CudaDeviceFollowsLocalRank) {
  ProcessContext& context = *test::g_context;
  const int device = context.cuda_device_index();
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(device, -1);
    return;
  }
  EXPECT_EQ(device, context.info().local_rank % static_cast<int>(torch::cuda::device_count()));
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
