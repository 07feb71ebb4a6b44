// A small MPI job for tests/test_failure.cpp: every rank loops on allreduces until one rank fails
// in the way named on the command line (killed, stalled, frozen, or raising an error), or, in
// `pause` mode, for kPauseRunSeconds of rank 0's clock, then ends cleanly.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "distributed/errors.h"
#include "distributed/mpi_communicator.h"
#include "distributed/process_context.h"

namespace {
// Collectives run before the failing rank fails: peers are then inside the next one.
constexpr int kIterationsBeforeFailure = 20;
// The job gives up by itself long after any test's deadline, so it can never run forever.
constexpr int kMaxIterations = 200000;
// `pause`: how long the job runs (rank 0's clock), long enough for the test to suspend it.
constexpr double kPauseRunSeconds = 10.0;
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr,
                 "usage: failure_probe kill|stall|freeze|throw|pause PID_DIR TIMEOUT_S [HEARTBEAT_S]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const std::string pid_dir = argv[2];
  const double timeout_s = std::stod(argv[3]);
  const double heartbeat_s = argc == 5 ? std::stod(argv[4]) : 0.0;
  try {
    tessera::distributed::ProcessContext context(&argc, &argv, timeout_s, heartbeat_s);
    if (!context.heartbeat_warning().empty())
      std::fprintf(stderr, "%s\n", context.heartbeat_warning().c_str());
    std::ofstream(pid_dir + "/rank-" + std::to_string(context.rank()) + ".pid") << getpid() << "\n";
    tessera::distributed::MpiCommunicator comm(context);
    const int victim = context.size() - 1;
    torch::Tensor t = torch::ones({1 << 18});
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kMaxIterations; ++i) {
      if (mode == "pause") {
        const std::chrono::duration<double> ran = std::chrono::steady_clock::now() - start;
        torch::Tensor done = torch::full({1}, context.rank() == 0 && ran.count() > kPauseRunSeconds ? 1.0 : 0.0);
        comm.allreduce(done, tessera::distributed::ReduceOp::Max);
        if (done.item<double>() > 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (context.rank() == victim && i == kIterationsBeforeFailure) {
        if (mode == "kill") raise(SIGKILL);
        if (mode == "stall") std::this_thread::sleep_for(std::chrono::hours(1));
        if (mode == "freeze") raise(SIGSTOP);  // every thread stops, the heartbeat's too
        if (mode == "throw")
          throw tessera::DistributedError("rank " + std::to_string(context.rank()) +
                                          ": injected failure");
      }
      comm.allreduce(t, tessera::distributed::ReduceOp::Max);
    }
  } catch (const tessera::DistributedError& e) {
    tessera::distributed::ProcessContext::abort_job(tessera::kExitDistributed, e.what());
  }
  return 0;
}
