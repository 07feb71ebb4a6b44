// CUDA fixed_point_add / normalize / to_float: one thread per element, grid-stride. No atomics on
// the digits (each element is its own thread's); the count of values that cannot be held is one
// integer atomic add per block, exact in any order.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "kernels/fixed_point.h"
#include "kernels/fixed_point_math.h"

namespace tessera::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(kMaxBlocks, (n + kThreads - 1) / kThreads)));
}

__global__ void add_kernel(const float* __restrict__ in, int64_t n, int64_t* __restrict__ limbs,
                           unsigned long long* __restrict__ bad) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x)
    if (in[i] != 0.0f && !fixed_point::add(in[i], limbs + i * kFixedPointLimbs)) ++local;
  if (local) atomicAdd(bad, local);
}

__global__ void normalize_kernel(int64_t n, int64_t* __restrict__ limbs) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x)
    fixed_point::normalize(limbs + i * kFixedPointLimbs);
}

template <typename T>
__global__ void to_float_kernel(const int64_t* __restrict__ limbs, int64_t n, T* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x)
    out[i] = static_cast<T>(fixed_point::to_double(limbs + i * kFixedPointLimbs));
}

}  // namespace

void fixed_point_add(at::Tensor& acc, const at::Tensor& values, at::Tensor& bad) {
  TORCH_CHECK(acc.scalar_type() == at::kLong && acc.dim() == 2 &&
                  acc.size(1) == kFixedPointLimbs && acc.is_contiguous(),
              "fixed_point_add: the accumulator must be a contiguous int64 [n, 4] tensor");
  TORCH_CHECK(values.scalar_type() == at::kFloat && values.numel() == acc.size(0),
              "fixed_point_add: values must be float32 with one value per accumulator row");
  TORCH_CHECK(bad.scalar_type() == at::kLong && bad.numel() == 1 && bad.device() == acc.device(),
              "fixed_point_add: bad must be an int64 [1] tensor on the accumulator's device");
  const c10::cuda::CUDAGuard guard(acc.device());
  const at::Tensor v = values.contiguous();
  const int64_t n = v.numel();
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      v.data_ptr<float>(), n, acc.data_ptr<int64_t>(),
      reinterpret_cast<unsigned long long*>(bad.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void fixed_point_normalize(at::Tensor& acc) {
  const c10::cuda::CUDAGuard guard(acc.device());
  const int64_t n = acc.size(0);
  if (n == 0) return;
  normalize_kernel<<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      n, acc.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor fixed_point_to_float(const at::Tensor& acc, at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
              "fixed_point_to_float: dtype must be float32 or float64");
  const c10::cuda::CUDAGuard guard(acc.device());
  const at::Tensor in = acc.contiguous();
  const int64_t n = in.size(0);
  at::Tensor out = at::empty({n}, in.options().dtype(dtype));
  if (n == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (dtype == at::kFloat)
    to_float_kernel<float><<<blocks_for(n), kThreads, 0, stream>>>(in.data_ptr<int64_t>(), n,
                                                                   out.data_ptr<float>());
  else
    to_float_kernel<double><<<blocks_for(n), kThreads, 0, stream>>>(in.data_ptr<int64_t>(), n,
                                                                    out.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace tessera::kernels::cuda
