// CUDA spherical_harmonics_fwd / spherical_harmonics_bwd: one thread per Gaussian running the
// per-Gaussian math of kernels/spherical_harmonics_math.h (the same code as the CPU version).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/spherical_harmonics.h"
#include "kernels/spherical_harmonics_math.h"

namespace tessera::kernels::cuda {

namespace {

// One thread per Gaussian; the basis (16 values and 48 derivatives at degree 3) stays in
// registers. 256 threads per block keep 8 warps resident.
constexpr int kThreadsPerBlock = 256;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

template <typename T>
__global__ void spherical_harmonics_fwd_kernel(int64_t n, int degree, int64_t rest_rows,
                                               const T* __restrict__ dirs,  // [N, 3]
                                               const T* __restrict__ dc,    // [N, 1, 3]
                                               const T* __restrict__ rest,  // [N, K - 1, 3]
                                               T* __restrict__ colors) {    // [N, 3]
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  sh_math::sh_forward<T>(degree, dirs + 3 * i, dc + 3 * i, rest + 3 * rest_rows * i,
                         colors + 3 * i);
}

template <typename T>
__global__ void spherical_harmonics_bwd_kernel(int64_t n, int degree, int64_t rest_rows,
                                               const T* __restrict__ dirs,      // [N, 3]
                                               const T* __restrict__ dc,        // [N, 1, 3]
                                               const T* __restrict__ rest,      // [N, K - 1, 3]
                                               const T* __restrict__ v_colors,  // [N, 3]
                                               T* __restrict__ v_dirs,          // [N, 3]
                                               T* __restrict__ v_dc,            // [N, 1, 3]
                                               T* __restrict__ v_rest) {        // [N, K - 1, 3]
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  sh_math::sh_backward<T>(degree, static_cast<int>(rest_rows + 1), dirs + 3 * i, dc + 3 * i,
                          rest + 3 * rest_rows * i, v_colors + 3 * i, v_dc + 3 * i,
                          v_rest + 3 * rest_rows * i, v_dirs + 3 * i);
}

// Launchers: the stream is explicit; nothing is launched for N == 0.
void launch_fwd(int64_t degree, const at::Tensor& dirs, const at::Tensor& dc,
                const at::Tensor& rest, const at::Tensor& colors, cudaStream_t stream) {
  const int64_t n = dirs.size(0);
  if (n == 0) return;
  AT_DISPATCH_FLOATING_TYPES(dirs.scalar_type(), "spherical_harmonics_fwd_cuda", [&] {
    spherical_harmonics_fwd_kernel<scalar_t><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
        n, static_cast<int>(degree), rest.size(1), dirs.data_ptr<scalar_t>(),
        dc.data_ptr<scalar_t>(), rest.data_ptr<scalar_t>(), colors.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void launch_bwd(int64_t degree, const at::Tensor& dirs, const at::Tensor& dc,
                const at::Tensor& rest, const at::Tensor& v_colors,
                const SphericalHarmonicsGrads& grads, cudaStream_t stream) {
  const int64_t n = dirs.size(0);
  if (n == 0) return;
  AT_DISPATCH_FLOATING_TYPES(dirs.scalar_type(), "spherical_harmonics_bwd_cuda", [&] {
    spherical_harmonics_bwd_kernel<scalar_t><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
        n, static_cast<int>(degree), rest.size(1), dirs.data_ptr<scalar_t>(),
        dc.data_ptr<scalar_t>(), rest.data_ptr<scalar_t>(), v_colors.data_ptr<scalar_t>(),
        grads.v_dirs.data_ptr<scalar_t>(), grads.v_dc.data_ptr<scalar_t>(),
        grads.v_rest.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

at::Tensor spherical_harmonics_fwd(int64_t degree, const at::Tensor& dirs, const at::Tensor& dc,
                                   const at::Tensor& rest) {
  const c10::cuda::CUDAGuard guard(dirs.device());
  const at::Tensor dir = dirs.contiguous();
  at::Tensor colors = at::empty({dir.size(0), 3}, dir.options());
  launch_fwd(degree, dir, dc.contiguous(), rest.contiguous(), colors,
             c10::cuda::getCurrentCUDAStream());
  return colors;
}

SphericalHarmonicsGrads spherical_harmonics_bwd(int64_t degree, const at::Tensor& dirs,
                                                const at::Tensor& dc, const at::Tensor& rest,
                                                const at::Tensor& v_colors) {
  const c10::cuda::CUDAGuard guard(dirs.device());
  const at::Tensor dir = dirs.contiguous(), dc_c = dc.contiguous(), rest_c = rest.contiguous();
  SphericalHarmonicsGrads grads;
  grads.v_dirs = at::empty({dir.size(0), 3}, dir.options());
  grads.v_dc = at::empty({dir.size(0), 1, 3}, dir.options());
  grads.v_rest = at::empty({dir.size(0), rest_c.size(1), 3}, dir.options());
  launch_bwd(degree, dir, dc_c, rest_c, v_colors.contiguous(), grads,
             c10::cuda::getCurrentCUDAStream());
  return grads;
}

}  // namespace tessera::kernels::cuda
