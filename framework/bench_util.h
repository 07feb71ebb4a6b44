// What the `tessera bench` commands share (launch/ and the families' benches in models/):
// medians, the max over ranks, rank-0 progress lines, device sync, a per-rank temporary folder,
// and the subcommand a family adds under `tessera bench`.
#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <cstdio>
#include <cstdint>
#include <functional>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "framework/phase_timer.h"

namespace CLI {
class App;
}

namespace tessera::distributed {
class ProcessContext;
}

namespace tessera::bench {

// A `tessera bench NAME` subcommand and the function that runs it (exit code).
struct BenchCommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

double median(std::vector<double> values);  // of a non-empty list

// {"project":0.012,...}: a JSON object of seconds per phase, in order.
std::string phases_json(const PhaseTimes& phases);

// The largest `value` over the ranks of `comm` (MPI_Allreduce MAX). Collective.
double max_over_ranks(MPI_Comm comm, double value);
// The sum of `value` over the ranks of `comm` (MPI_Allreduce SUM). Collective.
double sum_over_ranks(MPI_Comm comm, double value);

// "[bench NAME] ..." on stderr, rank 0 only.
template <typename... Args>
void progress(int rank, const char* name, const char* format, const Args&... args) {
  if (rank != 0) return;
  std::fprintf(stderr, "[bench %s] ", name);
  std::fprintf(stderr, format, args...);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

void sync(torch::Device device);  // waits for the device's queued work (no-op on CPU)

// The device of a bench's --device option: "cpu"; "cuda" (UserError naming `bench` unless every
// rank has a CUDA device of its own); "auto" = CUDA when every rank has one, else the CPU. On
// the CPU it installs the counting allocator, so that peak memory can be measured.
torch::Device bench_device(const distributed::ProcessContext& context, const std::string& option,
                           const std::string& bench);

// A fresh temporary folder "tessera-bench-NAME-XXXXXX", removed with its contents on scope exit
// (each rank its own: works without a shared file system).
struct TempDir {
  explicit TempDir(const std::string& name);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path path;
};

// The dataset a bench runs on: `scene` when given; otherwise a synthetic scene of `preset`
// (views, size x size, seed) written into a new `temp` folder (each rank its own).
std::string bench_scene(const std::string& name, int rank, const std::string& scene,
                        const std::string& preset, int views, int size, uint64_t seed,
                        std::unique_ptr<TempDir>& temp);

}  // namespace tessera::bench
