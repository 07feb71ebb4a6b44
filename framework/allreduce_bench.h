// `tessera bench allreduce`: the Communicator's allreduce against the library call itself (a raw
// MPI_Allreduce, or ncclAllReduce on the GPU) on the same buffer, for doubling message sizes; one
// JSON line per size on rank 0's stdout (docs/performance.md).
#pragma once

#include <cstdint>
#include <string>

namespace tessera::bench {

struct AllreduceBenchOptions {
  // Messages from min_bytes to max_bytes, doubling; `iters` timed runs of each method per size
  // after `warmup` untimed ones; the device as bench_device takes it.
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 256 << 20;
  int iters = 20;
  int warmup = 3;
  std::string device = "auto";
  double timeout_s = 600;
};

// Runs the bench on every rank of MPI_COMM_WORLD (starts MPI); UserError for bad sizes.
int run_allreduce_bench(const AllreduceBenchOptions& options);

}  // namespace tessera::bench
