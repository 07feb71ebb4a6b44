// CPU count_nonfinite: a parallel scan over contiguous chunks, one partial count per chunk,
// and the dispatch between the CPU and CUDA implementations.
#include "kernels/cpu/parallel.h"
#include "kernels/nonfinite.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>

namespace tessera::kernels {

namespace {
// Elements per parallel task: large enough that scheduling costs nothing next to the scan.
constexpr int64_t kGrain = 1 << 15;
}  // namespace

torch::Tensor cpu::count_nonfinite(const torch::Tensor& values) {
  const torch::Tensor input = values.contiguous();
  std::atomic<int64_t> total{0};
  if (input.is_floating_point() && input.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "count_nonfinite", [&] {
      const scalar_t* data = input.data_ptr<scalar_t>();
      tessera::parallel_for(0, input.numel(), kGrain, [&](int64_t begin, int64_t end) {
        int64_t local = 0;
        for (int64_t i = begin; i < end; ++i)
          // In the type's own math type: a finite double beyond float's range stays finite.
          local += std::isfinite(static_cast<at::opmath_type<scalar_t>>(data[i])) ? 0 : 1;
        total.fetch_add(local, std::memory_order_relaxed);
      });
    });
  }
  return torch::tensor(total.load(), torch::dtype(torch::kInt64));
}

torch::Tensor count_nonfinite(const torch::Tensor& values) {
#ifdef TESSERA_WITH_CUDA
  if (values.is_cuda()) return cuda::count_nonfinite(values);
#endif
  TORCH_CHECK(values.is_cpu(), "count_nonfinite: no implementation for device ", values.device(),
              " in this build");
  return cpu::count_nonfinite(values);
}

bool cuda_kernels_built() {
#ifdef TESSERA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace tessera::kernels
