// main() for multi-rank GoogleTest binaries: one ProcessContext (MPI) around the whole run,
// every rank runs every test, and only rank 0 prints the progress of passing tests.
#include <gtest/gtest.h>

#include "distributed/process_context.h"
#include "framework/thread_invariance.h"
#include "tests/mpi_test_env.h"

namespace tessera::test {
distributed::ProcessContext* g_context = nullptr;
}

namespace {
// Rank 0 prints the usual GoogleTest output; other ranks print only failures, with their rank.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name(),
                   result.line_number(), result.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  tessera::request_reproducible_blas();  // before any GEMM, as the tessera binary does
  testing::InitGoogleTest(&argc, argv);
  // Tests must finish well inside this; a hang aborts the job instead of stalling CTest.
  constexpr double kCollectiveTimeoutS = 120.0;
  tessera::distributed::ProcessContext context(&argc, &argv, kCollectiveTimeoutS);
  tessera::test::g_context = &context;
  if (context.rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(context.rank()));
  }
  const int local = RUN_ALL_TESTS();
  // Every rank learns whether any rank failed, so the job's exit code is the same everywhere.
  int any = local;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, context.world());
  auto& releases = tessera::test::before_finalize();
  for (auto it = releases.rbegin(); it != releases.rend(); ++it) (*it)();
  releases.clear();
  tessera::test::g_context = nullptr;
  return any;
}
