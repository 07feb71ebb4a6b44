// CUDA volume_render_fwd / volume_render_bwd: one thread per ray walks its samples front to back
// (kernels/volume_render_math.h, shared with the CPU), as in nerfacc and instant-ngp. Backward
// recomputes transmittance instead of storing it.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/tensor_args.h"
#include "kernels/volume_render.h"
#include "kernels/volume_render_math.h"

namespace tessera::kernels::cuda {

namespace {

// One thread per ray. Rays differ in length, so warps diverge at their ends; a warp per ray
// would need a scan per sample chunk and only pays off for rays far longer than the 32-256
// samples a NeRF batch has. 256 threads keep 8 warps per block resident with registers to spare.
constexpr int kThreadsPerBlock = 256;

__device__ __forceinline__ float exp_neg(float x) { return expf(-x); }
__device__ __forceinline__ double exp_neg(double x) { return exp(-x); }

// Bounds of the ray's samples; a device assert (like torch's own index checks) when the offsets
// do not cover [0, S) once in order.
__device__ __forceinline__ void ray_bounds(const int64_t* __restrict__ offsets, int64_t ray,
                                           int64_t num_rays, int64_t num_samples,
                                           int64_t& first, int64_t& last) {
  first = offsets[ray];
  last = offsets[ray + 1];
  CUDA_KERNEL_ASSERT_MSG(0 <= first && first <= last && last <= num_samples,
                         "volume_render: ray_offsets must be non-decreasing within [0, S]");
  if (ray == 0) {
    CUDA_KERNEL_ASSERT_MSG(first == 0, "volume_render: ray_offsets[0] must be 0");
  }
  if (ray == num_rays - 1) {
    CUDA_KERNEL_ASSERT_MSG(last == num_samples, "volume_render: ray_offsets[R] must be S");
  }
}

template <typename scalar_t>
__global__ void volume_render_fwd_kernel(
    int64_t num_rays, int64_t num_samples, scalar_t threshold,
    const scalar_t* __restrict__ sigmas,  // [S]
    const scalar_t* __restrict__ rgbs,    // [S, 3]
    const scalar_t* __restrict__ deltas,  // [S]
    const scalar_t* __restrict__ ts,      // [S]
    const int64_t* __restrict__ offsets,  // [R + 1]
    scalar_t* __restrict__ out_rgb,       // [R, 3]
    scalar_t* __restrict__ out_opacity,   // [R]
    scalar_t* __restrict__ out_depth,     // [R]
    scalar_t* out_weights,                // [S]
    int64_t* __restrict__ out_num_steps) {  // [R]
  const int64_t ray = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ray >= num_rays) return;
  int64_t first, last;
  ray_bounds(offsets, ray, num_rays, num_samples, first, last);
  const auto c = volume_math::composite_ray<scalar_t>(
      first, last, threshold, [&](int64_t i) { return exp_neg(sigmas[i] * deltas[i]); }, rgbs, ts,
      out_weights);
  volume_math::store_ray(c, ray, out_rgb, out_opacity, out_depth, out_num_steps);
}

// volume_math::backprop_ray, the reverse of the forward, per ray.
template <typename scalar_t>
__global__ void volume_render_bwd_kernel(
    int64_t num_rays, int64_t num_samples,
    const scalar_t* __restrict__ sigmas,     // [S]
    const scalar_t* __restrict__ rgbs,       // [S, 3]
    const scalar_t* __restrict__ deltas,     // [S]
    const scalar_t* __restrict__ ts,         // [S]
    const int64_t* __restrict__ offsets,     // [R + 1]
    const scalar_t* __restrict__ rgb,        // [R, 3]
    const scalar_t* __restrict__ opacity,    // [R]
    const scalar_t* __restrict__ depth,      // [R]
    const scalar_t* __restrict__ weights,    // [S]
    const int64_t* __restrict__ num_steps,   // [R]
    const scalar_t* __restrict__ v_rgb,      // [R, 3] or null (zero)
    const scalar_t* __restrict__ v_opacity,  // [R] or null
    const scalar_t* __restrict__ v_depth,    // [R] or null
    const scalar_t* __restrict__ v_weights,  // [S] or null
    scalar_t* v_sigmas,                      // [S]
    scalar_t* __restrict__ v_rgbs) {         // [S, 3]
  const int64_t ray = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ray >= num_rays) return;
  int64_t first, last;
  ray_bounds(offsets, ray, num_rays, num_samples, first, last);
  const int64_t stop = first + num_steps[ray];
  CUDA_KERNEL_ASSERT_MSG(first <= stop && stop <= last,
                         "volume_render_bwd: num_steps does not fit the ray");
  volume_math::backprop_ray<scalar_t>(
      first, stop, last, [&](int64_t i) { return exp_neg(sigmas[i] * deltas[i]); },
      volume_math::ray_cotangent(ray, v_rgb, v_opacity, v_depth), rgb + 3 * ray, opacity[ray],
      depth[ray], rgbs, deltas, ts, weights, v_weights, v_sigmas, v_rgbs);
}

unsigned blocks_for(int64_t num_rays) {
  return static_cast<unsigned>((num_rays + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

// Launchers: the stream is explicit; nothing is launched for R == 0.
void launch_fwd(const at::Tensor& sigmas, const at::Tensor& rgbs,
                const at::Tensor& deltas, const at::Tensor& ts,
                const at::Tensor& offsets, double threshold, const VolumeRenderOutput& out,
                cudaStream_t stream) {
  const int64_t num_rays = offsets.size(0) - 1;
  if (num_rays == 0) return;
  AT_DISPATCH_FLOATING_TYPES(sigmas.scalar_type(), "volume_render_fwd_cuda", [&] {
    volume_render_fwd_kernel<scalar_t><<<blocks_for(num_rays), kThreadsPerBlock, 0, stream>>>(
        num_rays, sigmas.size(0), static_cast<scalar_t>(threshold), sigmas.data_ptr<scalar_t>(),
        rgbs.data_ptr<scalar_t>(), deltas.data_ptr<scalar_t>(), ts.data_ptr<scalar_t>(),
        offsets.data_ptr<int64_t>(), out.rgb.data_ptr<scalar_t>(),
        out.opacity.data_ptr<scalar_t>(), out.depth.data_ptr<scalar_t>(),
        out.weights.data_ptr<scalar_t>(), out.num_steps.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void launch_bwd(const at::Tensor& sigmas, const at::Tensor& rgbs,
                const at::Tensor& deltas, const at::Tensor& ts,
                const at::Tensor& offsets, const at::Tensor& rgb,
                const at::Tensor& opacity, const at::Tensor& depth,
                const at::Tensor& weights, const at::Tensor& num_steps,
                const at::Tensor& v_rgb, const at::Tensor& v_opacity,
                const at::Tensor& v_depth, const at::Tensor& v_weights,
                const VolumeRenderGrads& grads, cudaStream_t stream) {
  const int64_t num_rays = offsets.size(0) - 1;
  if (num_rays == 0) return;
  AT_DISPATCH_FLOATING_TYPES(sigmas.scalar_type(), "volume_render_bwd_cuda", [&] {
    volume_render_bwd_kernel<scalar_t><<<blocks_for(num_rays), kThreadsPerBlock, 0, stream>>>(
        num_rays, sigmas.size(0), sigmas.data_ptr<scalar_t>(), rgbs.data_ptr<scalar_t>(),
        deltas.data_ptr<scalar_t>(), ts.data_ptr<scalar_t>(), offsets.data_ptr<int64_t>(),
        rgb.data_ptr<scalar_t>(), opacity.data_ptr<scalar_t>(), depth.data_ptr<scalar_t>(),
        weights.data_ptr<scalar_t>(), num_steps.data_ptr<int64_t>(), optional_ptr<scalar_t>(v_rgb),
        optional_ptr<scalar_t>(v_opacity), optional_ptr<scalar_t>(v_depth),
        optional_ptr<scalar_t>(v_weights), grads.v_sigmas.data_ptr<scalar_t>(),
        grads.v_rgbs.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

VolumeRenderOutput volume_render_fwd(const at::Tensor& sigmas, const at::Tensor& rgbs,
                                     const at::Tensor& deltas, const at::Tensor& ts,
                                     const at::Tensor& ray_offsets,
                                     double transmittance_threshold) {
  const c10::cuda::CUDAGuard guard(sigmas.device());
  const at::Tensor sigma = sigmas.contiguous(), rgb = rgbs.contiguous(),
                      delta = deltas.contiguous(), t = ts.contiguous(),
                      offsets = ray_offsets.contiguous();
  const int64_t num_samples = sigma.size(0);
  const int64_t num_rays = offsets.size(0) - 1;
  VolumeRenderOutput out;
  out.rgb = at::empty({num_rays, 3}, sigma.options());
  out.opacity = at::empty({num_rays}, sigma.options());
  out.depth = at::empty({num_rays}, sigma.options());
  // Every sample belongs to one ray (asserted), so the kernel writes every weight; with R == 0,
  // S is 0 too.
  out.weights = at::empty({num_samples}, sigma.options());
  out.num_steps = at::empty({num_rays}, offsets.options());
  launch_fwd(sigma, rgb, delta, t, offsets, transmittance_threshold, out,
             c10::cuda::getCurrentCUDAStream());
  return out;
}

VolumeRenderGrads volume_render_bwd(const at::Tensor& sigmas, const at::Tensor& rgbs,
                                    const at::Tensor& deltas, const at::Tensor& ts,
                                    const at::Tensor& ray_offsets, const at::Tensor& rgb,
                                    const at::Tensor& opacity, const at::Tensor& depth,
                                    const at::Tensor& weights, const at::Tensor& num_steps,
                                    const at::Tensor& v_rgb, const at::Tensor& v_opacity,
                                    const at::Tensor& v_depth, const at::Tensor& v_weights) {
  const c10::cuda::CUDAGuard guard(sigmas.device());
  const at::Tensor sigma = sigmas.contiguous();
  const int64_t num_samples = sigma.size(0);
  VolumeRenderGrads grads;
  grads.v_sigmas = at::empty({num_samples}, sigma.options());
  grads.v_rgbs = at::empty({num_samples, 3}, sigma.options());
  launch_bwd(sigma, rgbs.contiguous(), deltas.contiguous(), ts.contiguous(),
             ray_offsets.contiguous(), rgb.contiguous(), opacity.contiguous(), depth.contiguous(),
             weights.contiguous(), num_steps.contiguous(), contiguous_or_undefined(v_rgb),
             contiguous_or_undefined(v_opacity), contiguous_or_undefined(v_depth),
             contiguous_or_undefined(v_weights), grads, c10::cuda::getCurrentCUDAStream());
  return grads;
}

}  // namespace tessera::kernels::cuda
