// CUDA ray_march_fwd: a count kernel (one thread per ray), at::cumsum for the scan, then a fill
// kernel that marches again. The marching rule is kernels/ray_march_math.h, shared with the CPU
// bit for bit: every op rounds once.
#include <ATen/core/Tensor.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/ray_march.h"
#include "kernels/ray_march_math.h"

namespace tessera::kernels::cuda {

namespace {

// One thread per ray. Rays differ in length, so warps diverge where short rays finish; 256
// threads keep 8 warps per block resident, and a 4096-ray batch still fills 16 blocks.
constexpr int kThreadsPerBlock = 256;

using march::Grid;  // passed by value to the kernels, its `occupied` in device memory

__global__ void ray_march_count_kernel(
    int64_t num_rays, Grid grid, float step_size, float cone_angle, float max_step, bool contract,
    int64_t max_samples,
    const float* __restrict__ origins,     // [R, 3]
    const float* __restrict__ directions,  // [R, 3]
    const float* __restrict__ near,        // [R]
    const float* __restrict__ far,         // [R]
    int64_t* __restrict__ counts) {        // [R]
  const int64_t ray = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ray >= num_rays) return;
  counts[ray] = march::march_ray(origins + 3 * ray, directions + 3 * ray, near[ray], far[ray],
                                 grid, step_size, cone_angle, max_step, contract, max_samples,
                                 [](int64_t, float, float, float, float, float) {});
}

__global__ void ray_march_fill_kernel(
    int64_t num_rays, Grid grid, float step_size, float cone_angle, float max_step, bool contract,
    int64_t max_samples,
    const float* __restrict__ origins,     // [R, 3]
    const float* __restrict__ directions,  // [R, 3]
    const float* __restrict__ near,        // [R]
    const float* __restrict__ far,         // [R]
    const int64_t* __restrict__ offsets,   // [R + 1]
    float* __restrict__ ts,                // [S]
    float* __restrict__ deltas,            // [S]
    float* __restrict__ positions,         // [S, 3]
    int64_t* __restrict__ ray_indices) {   // [S]
  const int64_t ray = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ray >= num_rays) return;
  const int64_t base = offsets[ray];
  if (offsets[ray + 1] == base) return;
  const int64_t kept = march::march_ray(
      origins + 3 * ray, directions + 3 * ray, near[ray], far[ray], grid, step_size, cone_angle,
      max_step, contract, max_samples,
      march::SampleWriter{ts, deltas, positions, ray_indices, base, ray});
  CUDA_KERNEL_ASSERT_MSG(kept == offsets[ray + 1] - base,
                         "ray_march: the fill pass disagrees with the count pass");
}

unsigned blocks_for(int64_t num_rays) {
  return static_cast<unsigned>((num_rays + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

// Launchers: the stream is explicit; nothing is launched for R == 0.
void launch_count(const at::Tensor& o, const at::Tensor& d, const at::Tensor& near,
                  const at::Tensor& far, const Grid& grid,
                  const RayMarchParams& p, const at::Tensor& counts, cudaStream_t stream) {
  const int64_t num_rays = o.size(0);
  if (num_rays == 0) return;
  ray_march_count_kernel<<<blocks_for(num_rays), kThreadsPerBlock, 0, stream>>>(
      num_rays, grid, p.step_size, p.cone_angle, p.max_step, p.contract, p.max_samples_per_ray,
      o.data_ptr<float>(), d.data_ptr<float>(), near.data_ptr<float>(), far.data_ptr<float>(),
      counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_fill(const at::Tensor& o, const at::Tensor& d, const at::Tensor& near,
                 const at::Tensor& far, const Grid& grid,
                 const RayMarchParams& p, const RayMarchOutput& out, cudaStream_t stream) {
  const int64_t num_rays = o.size(0);
  if (num_rays == 0 || out.ts.numel() == 0) return;
  ray_march_fill_kernel<<<blocks_for(num_rays), kThreadsPerBlock, 0, stream>>>(
      num_rays, grid, p.step_size, p.cone_angle, p.max_step, p.contract, p.max_samples_per_ray,
      o.data_ptr<float>(), d.data_ptr<float>(), near.data_ptr<float>(), far.data_ptr<float>(),
      out.ray_offsets.data_ptr<int64_t>(), out.ts.data_ptr<float>(),
      out.deltas.data_ptr<float>(), out.positions.data_ptr<float>(),
      out.ray_indices.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

RayMarchOutput ray_march_fwd(const at::Tensor& origins, const at::Tensor& directions,
                             const at::Tensor& near, const at::Tensor& far,
                             const at::Tensor& aabb, const at::Tensor& occupancy,
                             const RayMarchParams& params) {
  const c10::cuda::CUDAGuard guard(origins.device());
  const at::Tensor o = origins.contiguous(), d = directions.contiguous(),
                      t_near = near.contiguous(), t_far = far.contiguous();
  at::Tensor occ = occupancy.contiguous();
  if (occ.scalar_type() == at::kBool) occ = occ.view(at::kByte);  // same bytes, 0 or 1
  const at::Tensor box = aabb.to(at::kCPU).contiguous();
  const int64_t res[3] = {occ.size(0), occ.size(1), occ.size(2)};
  Grid grid = march::make_grid(box.data_ptr<float>(), res, params.contract);
  grid.occupied = occ.data_ptr<uint8_t>();
  const int64_t num_rays = o.size(0);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto i64 = o.options().dtype(at::kLong);

  // Pass 1: counts, then the exclusive scan: ray_offsets = [0, cumsum(counts)].
  const at::Tensor counts = at::empty({num_rays}, i64);
  launch_count(o, d, t_near, t_far, grid, params, counts, stream);
  RayMarchOutput out;
  out.ray_offsets = at::zeros({num_rays + 1}, i64);
  if (num_rays > 0) {
    at::Tensor tail = out.ray_offsets.slice(0, 1);  // [R], a view: the scan writes in place
    at::cumsum_out(tail, counts, 0);
  }
  const int64_t num_samples = out.ray_offsets[num_rays].item<int64_t>();  // syncs once

  // Pass 2: march again, writing each ray's samples at its offset.
  const auto f32 = o.options();
  out.ts = at::empty({num_samples}, f32);
  out.deltas = at::empty({num_samples}, f32);
  out.positions = at::empty({num_samples, 3}, f32);
  out.ray_indices = at::empty({num_samples}, i64);
  launch_fill(o, d, t_near, t_far, grid, params, out, stream);
  return out;
}

}  // namespace tessera::kernels::cuda
