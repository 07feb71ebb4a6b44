// CUDA project_gaussians_fwd / project_gaussians_bwd: one thread per Gaussian running the
// per-Gaussian math of kernels/gaussian_projection_math.h (the same code as the CPU version).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/gaussian_projection.h"
#include "kernels/gaussian_projection_math.h"
#include "kernels/tensor_args.h"

namespace tessera::kernels::cuda {

namespace {

namespace pm = projection_math;

// One thread per Gaussian. The per-Gaussian state (a few 3x3 matrices) lives in registers;
// 256 threads per block keep enough warps resident to hide the loads.
constexpr int kThreadsPerBlock = 256;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

// The intrinsics are filled on the host (pm::camera_intrinsics) and passed by value; each thread
// reads the rotation and translation from viewmat on the device (pm::set_pose), so no
// device-to-host copy stalls the stream.
template <typename T>
__global__ void project_gaussians_fwd_kernel(int64_t n, pm::Camera<T> cam,
                                             const T* __restrict__ viewmat,  // [4, 4]
                                             const T* __restrict__ means,    // [N, 3]
                                             const T* __restrict__ quats,    // [N, 4]
                                             const T* __restrict__ scales,   // [N, 3]
                                             int32_t* __restrict__ radii,    // [N]
                                             T* __restrict__ means2d,        // [N, 2]
                                             T* __restrict__ depths,         // [N]
                                             T* __restrict__ conics) {       // [N, 3]
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  pm::set_pose(viewmat, cam);
  radii[i] = pm::project_forward<T>(means + 3 * i, quats + 4 * i, scales + 3 * i, cam,
                                    means2d + 2 * i, depths + i, conics + 3 * i);
}

template <typename T>
__global__ void project_gaussians_bwd_kernel(int64_t n, pm::Camera<T> cam,
                                             const T* __restrict__ viewmat,    // [4, 4]
                                             const T* __restrict__ means,      // [N, 3]
                                             const T* __restrict__ quats,      // [N, 4]
                                             const T* __restrict__ scales,     // [N, 3]
                                             const int32_t* __restrict__ radii,  // [N]
                                             const T* __restrict__ v_means2d,  // [N, 2] or null
                                             const T* __restrict__ v_depths,   // [N] or null
                                             const T* __restrict__ v_conics,   // [N, 3] or null
                                             T* __restrict__ v_means,          // [N, 3]
                                             T* __restrict__ v_quats,          // [N, 4]
                                             T* __restrict__ v_scales) {       // [N, 3]
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  if (radii[i] <= 0) {
    for (int k = 0; k < 3; ++k) v_means[3 * i + k] = v_scales[3 * i + k] = 0;
    for (int k = 0; k < 4; ++k) v_quats[4 * i + k] = 0;
    return;
  }
  pm::set_pose(viewmat, cam);
  pm::project_backward<T>(means + 3 * i, quats + 4 * i, scales + 3 * i, cam,
                          v_means2d ? v_means2d + 2 * i : nullptr,
                          v_depths ? v_depths + i : nullptr, v_conics ? v_conics + 3 * i : nullptr,
                          v_means + 3 * i, v_quats + 4 * i, v_scales + 3 * i);
}

// Launchers: the stream is explicit; nothing is launched for N == 0.
void launch_fwd(const at::Tensor& means, const at::Tensor& quats,
                const at::Tensor& scales, const at::Tensor& viewmat,
                const ProjectionCamera& camera, const ProjectionOutput& out,
                cudaStream_t stream) {
  const int64_t n = means.size(0);
  if (n == 0) return;
  AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "project_gaussians_fwd_cuda", [&] {
    const pm::Camera<scalar_t> cam = pm::camera_intrinsics<scalar_t>(camera);
    project_gaussians_fwd_kernel<scalar_t><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
        n, cam, viewmat.data_ptr<scalar_t>(), means.data_ptr<scalar_t>(),
        quats.data_ptr<scalar_t>(), scales.data_ptr<scalar_t>(), out.radii.data_ptr<int32_t>(),
        out.means2d.data_ptr<scalar_t>(), out.depths.data_ptr<scalar_t>(),
        out.conics.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void launch_bwd(const at::Tensor& means, const at::Tensor& quats,
                const at::Tensor& scales, const at::Tensor& viewmat,
                const ProjectionCamera& camera, const at::Tensor& radii,
                const at::Tensor& v_means2d, const at::Tensor& v_depths,
                const at::Tensor& v_conics, const ProjectionGrads& grads,
                cudaStream_t stream) {
  const int64_t n = means.size(0);
  if (n == 0) return;
  AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "project_gaussians_bwd_cuda", [&] {
    const pm::Camera<scalar_t> cam = pm::camera_intrinsics<scalar_t>(camera);
    project_gaussians_bwd_kernel<scalar_t><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
        n, cam, viewmat.data_ptr<scalar_t>(), means.data_ptr<scalar_t>(),
        quats.data_ptr<scalar_t>(), scales.data_ptr<scalar_t>(), radii.data_ptr<int32_t>(),
        optional_ptr<scalar_t>(v_means2d), optional_ptr<scalar_t>(v_depths),
        optional_ptr<scalar_t>(v_conics), grads.v_means.data_ptr<scalar_t>(),
        grads.v_quats.data_ptr<scalar_t>(), grads.v_scales.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

ProjectionOutput project_gaussians_fwd(const at::Tensor& means, const at::Tensor& quats,
                                       const at::Tensor& scales, const at::Tensor& viewmat,
                                       const ProjectionCamera& camera) {
  const c10::cuda::CUDAGuard guard(means.device());
  const at::Tensor mean = means.contiguous();
  const int64_t n = mean.size(0);
  const auto options = mean.options();
  ProjectionOutput out;
  out.radii = at::empty({n}, options.dtype(at::kInt));
  out.means2d = at::empty({n, 2}, options);
  out.depths = at::empty({n}, options);
  out.conics = at::empty({n, 3}, options);
  launch_fwd(mean, quats.contiguous(), scales.contiguous(), viewmat.contiguous(), camera, out,
             c10::cuda::getCurrentCUDAStream());
  return out;
}

ProjectionGrads project_gaussians_bwd(const at::Tensor& means, const at::Tensor& quats,
                                      const at::Tensor& scales, const at::Tensor& viewmat,
                                      const ProjectionCamera& camera, const at::Tensor& radii,
                                      const at::Tensor& v_means2d,
                                      const at::Tensor& v_depths,
                                      const at::Tensor& v_conics) {
  const c10::cuda::CUDAGuard guard(means.device());
  const at::Tensor mean = means.contiguous();
  const int64_t n = mean.size(0);
  const auto options = mean.options();
  ProjectionGrads grads;
  grads.v_means = at::empty({n, 3}, options);
  grads.v_quats = at::empty({n, 4}, options);
  grads.v_scales = at::empty({n, 3}, options);
  launch_bwd(mean, quats.contiguous(), scales.contiguous(), viewmat.contiguous(), camera,
             radii.contiguous(), contiguous_or_undefined(v_means2d),
             contiguous_or_undefined(v_depths), contiguous_or_undefined(v_conics), grads,
             c10::cuda::getCurrentCUDAStream());
  return grads;
}

}  // namespace tessera::kernels::cuda
