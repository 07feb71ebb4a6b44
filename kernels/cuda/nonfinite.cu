// CUDA count_nonfinite: a grid-stride scan, a per-block reduction in shared memory and one
// atomic add per block.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/nonfinite.h"

namespace tessera::kernels::cuda {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill every SM several times over; the grid-stride loop covers the rest.
constexpr int64_t kMaxBlocks = 4096;

template <typename scalar_t>
__global__ void count_nonfinite_kernel(const scalar_t* __restrict__ data, int64_t n,
                                       unsigned long long* __restrict__ out) {
  __shared__ unsigned int block_count[kThreads];
  unsigned int local = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x)
    local += isfinite(static_cast<at::opmath_type<scalar_t>>(data[i])) ? 0u : 1u;
  block_count[threadIdx.x] = local;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) block_count[threadIdx.x] += block_count[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0 && block_count[0] > 0) atomicAdd(out, block_count[0]);
}

}  // namespace

at::Tensor count_nonfinite(const at::Tensor& values) {
  const c10::cuda::CUDAGuard guard(values.device());
  const at::Tensor input = values.contiguous();
  at::Tensor out = at::zeros({}, input.options().dtype(at::kLong));
  const int64_t n = input.numel();
  if (n == 0 || !input.is_floating_point()) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = std::min(kMaxBlocks, (n + kThreads - 1) / kThreads);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "count_nonfinite_cuda", [&] {
    count_nonfinite_kernel<scalar_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        input.data_ptr<scalar_t>(), n,
        reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace tessera::kernels::cuda
