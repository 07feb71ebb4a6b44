// `tessera bench allreduce` (allreduce_bench.h): Tessera's Communicator vs the library call on the
// same buffer, medians of interleaved runs on the slowest rank.
#include "framework/allreduce_bench.h"

#include <mpi.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstdio>
#include <vector>

#ifdef TESSERA_WITH_NCCL
#include <ATen/cuda/CUDAContext.h>
#include "distributed/nccl_communicator.h"
#endif

#include "distributed/communicator.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/bench_util.h"
#include "framework/log.h"

namespace tessera::bench {

namespace {

// Wall time of `op` on the slowest rank (barrier first, so every rank starts together).
template <typename Op>
double timed_on_slowest(MPI_Comm comm, Op&& op) {
  MPI_CHECK(MPI_Barrier(comm));
  const auto start = std::chrono::steady_clock::now();
  op();
  return max_over_ranks(
      comm, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace

int run_allreduce_bench(const AllreduceBenchOptions& options) {
  if (options.min_bytes < 4 || options.max_bytes < options.min_bytes)
    throw UserError("bench allreduce: need 4 <= --min-bytes <= --max-bytes");
  distributed::ProcessContext context(nullptr, nullptr, options.timeout_s);
  log::init({context.rank(), "info", "", true});
  context.apply_thread_share(0);
  const torch::Device device = bench_device(context, options.device, "allreduce");
  auto comm = distributed::make_communicator(context, "auto", device);
  spdlog::info("bench allreduce: {} rank(s), backend {}, float32 sum, {} iterations per size "
               "(median of interleaved runs)",
               context.size(), distributed::to_string(comm->backend()), options.iters);

  // The baseline: the library call itself on the same buffer, no Tessera code in between.
  auto raw_allreduce = [&](torch::Tensor& buffer) {
#ifdef TESSERA_WITH_NCCL
    if (comm->backend() == distributed::Backend::Nccl) {
      auto* nccl = static_cast<distributed::NcclCommunicator*>(comm.get());
      const auto stream = at::cuda::getCurrentCUDAStream(device.index()).stream();
      nccl->check(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), ncclFloat32,
                                ncclSum, nccl->raw(), stream),
                  "ncclAllReduce", __FILE__, __LINE__);
      return;
    }
#endif
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buffer.data_ptr(), static_cast<int>(buffer.numel()),
                            MPI_FLOAT, MPI_SUM, context.world()));
  };
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };

  for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    torch::Tensor buffer = torch::zeros({bytes / 4}, torch::dtype(torch::kFloat32).device(device));
    std::vector<double> ours, raw;
    for (int i = 0; i < options.warmup + options.iters; ++i) {
      const double t_ours = timed_on_slowest(context.world(), [&] {
        comm->allreduce(buffer, distributed::ReduceOp::Sum);
        sync();
      });
      const double t_raw = timed_on_slowest(context.world(), [&] {
        raw_allreduce(buffer);
        sync();
      });
      if (i >= options.warmup) {
        ours.push_back(t_ours);
        raw.push_back(t_raw);
      }
    }
    const double tessera_s = median(ours), raw_s = median(raw);
    const int n = context.size();
    // nccl-tests' bus bandwidth: algorithm bandwidth times 2(n-1)/n, comparable across rank counts.
    const double busbw = n > 1 ? bytes / tessera_s * 2.0 * (n - 1) / n / 1e9 : 0.0;
    if (context.rank() == 0) {
      std::printf("{\"bench\":\"allreduce\",\"backend\":\"%s\",\"ranks\":%d,\"bytes\":%lld,"
                  "\"tessera_s\":%.6e,\"raw_s\":%.6e,\"busbw_gbs\":%.4g}\n",
                  distributed::to_string(comm->backend()), n, static_cast<long long>(bytes),
                  tessera_s, raw_s, busbw);
      std::fflush(stdout);
    }
  }
  return kExitOk;
}


}  // namespace tessera::bench
