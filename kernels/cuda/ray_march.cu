// CUDA ray_march_fwd: a count kernel (one thread per ray), torch::cumsum for the scan, then a fill
// kernel that marches again. Same float rule as the CPU file, bitwise: every op rounds once.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/ray_march.h"

namespace tessera::kernels::cuda {

namespace {

// One thread per ray. Rays differ in length, so warps diverge where short rays finish; 256
// threads keep 8 warps per block resident, and a 4096-ray batch still fills 16 blocks.
constexpr int kThreadsPerBlock = 256;

// The box and grid, passed by value to the kernels; scale is G / (hi - lo), rounded once on the
// host exactly as the CPU implementation does.
struct Grid {
  float lo[3], hi[3];          // the clipping box
  float cell_lo[3], scale[3];  // the grid's lower corner and G / extent (contracted: -2, G / 4)
  int64_t res[3];
};

// nvcc contracts a * b + c into one fused multiply-add by default, which rounds once instead of
// twice and would move samples across cell boundaries relative to the CPU. These round each op.
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }

__device__ __forceinline__ int64_t cell_of(float p, int a, const Grid& g) {
  const float v = mul(sub(p, g.cell_lo[a]), g.scale[a]);
  if (!(v > 0.0f)) return 0;
  if (v >= static_cast<float>(g.res[a])) return g.res[a] - 1;
  return static_cast<int64_t>(v);
}

// The rule of kernels/ray_march.h (the CPU file's march_ray, op for op). With Fill, writes the
// k-th kept sample at base + k; returns the number kept.
template <bool Fill>
__device__ int64_t march_ray(const float* __restrict__ o, const float* __restrict__ d, float near,
                             float far, const Grid& g, const uint8_t* __restrict__ occupied,
                             float step_size, float cone_angle, float max_step, bool contract,
                             int64_t max_samples, int64_t ray, int64_t base,
                             float* __restrict__ ts, float* __restrict__ deltas,
                             float* __restrict__ positions, int64_t* __restrict__ ray_indices) {
  if (max_samples == 0 || isnan(near) || isnan(far)) return 0;
  for (int a = 0; a < 3; ++a)
    if (!isfinite(o[a]) || !isfinite(d[a])) return 0;
  if (d[0] == 0.0f && d[1] == 0.0f && d[2] == 0.0f) return 0;
  float t_enter = -INFINITY, t_exit = INFINITY;
  for (int a = 0; a < 3; ++a) {
    if (d[a] == 0.0f) {
      if (!(g.lo[a] <= o[a] && o[a] <= g.hi[a])) return 0;
      continue;
    }
    const float t0 = div(sub(g.lo[a], o[a]), d[a]);
    const float t1 = div(sub(g.hi[a], o[a]), d[a]);
    const float lo = t0 < t1 ? t0 : t1, hi = t0 < t1 ? t1 : t0;
    if (lo > t_enter) t_enter = lo;
    if (hi < t_exit) t_exit = hi;
  }
  const float t_start = near > t_enter ? near : t_enter;
  const float t_end = far < t_exit ? far : t_exit;
  if (!(t_start < t_end)) return 0;

  const bool cone = cone_angle > 0.0f;
  int64_t kept = 0;
  float t = t_start;
  while (true) {
    float dt = step_size;
    if (cone) {
      dt = mul(t, cone_angle);
      if (dt < step_size) dt = step_size;
      if (dt > max_step) dt = max_step;
    }
    const float t_next = add(t, dt);
    if (t_next > t_end || t_next == t) break;
    const float t_mid = add(t, mul(0.5f, dt));
    const float px = add(o[0], mul(t_mid, d[0]));
    const float py = add(o[1], mul(t_mid, d[1]));
    const float pz = add(o[2], mul(t_mid, d[2]));
    float qx = px, qy = py, qz = pz;  // where the grid is looked up
    if (contract) {
      const float ax = fabsf(qx), ay = fabsf(qy), az = fabsf(qz);
      const float m = ax > ay ? (ax > az ? ax : az) : (ay > az ? ay : az);
      if (m > 1.0f) {
        const float s = div(sub(2.0f, div(1.0f, m)), m);
        qx = mul(qx, s), qy = mul(qy, s), qz = mul(qz, s);
      }
    }
    const int64_t cell =
        (cell_of(qx, 0, g) * g.res[1] + cell_of(qy, 1, g)) * g.res[2] + cell_of(qz, 2, g);
    if (occupied[cell]) {
      if (Fill) {
        const int64_t i = base + kept;
        ts[i] = t_mid;
        deltas[i] = dt;
        positions[3 * i + 0] = px;
        positions[3 * i + 1] = py;
        positions[3 * i + 2] = pz;
        ray_indices[i] = ray;
      }
      if (++kept == max_samples) break;
    }
    t = t_next;
  }
  return kept;
}

__global__ void ray_march_count_kernel(
    int64_t num_rays, Grid grid, float step_size, float cone_angle, float max_step, bool contract,
    int64_t max_samples,
    const float* __restrict__ origins,     // [R, 3]
    const float* __restrict__ directions,  // [R, 3]
    const float* __restrict__ near,        // [R]
    const float* __restrict__ far,         // [R]
    const uint8_t* __restrict__ occupied,  // [Gx, Gy, Gz]
    int64_t* __restrict__ counts) {        // [R]
  const int64_t ray = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ray >= num_rays) return;
  counts[ray] = march_ray<false>(origins + 3 * ray, directions + 3 * ray, near[ray], far[ray],
                                 grid, occupied, step_size, cone_angle, max_step, contract,
                                 max_samples, ray, 0, nullptr, nullptr, nullptr, nullptr);
}

__global__ void ray_march_fill_kernel(
    int64_t num_rays, Grid grid, float step_size, float cone_angle, float max_step, bool contract,
    int64_t max_samples,
    const float* __restrict__ origins,     // [R, 3]
    const float* __restrict__ directions,  // [R, 3]
    const float* __restrict__ near,        // [R]
    const float* __restrict__ far,         // [R]
    const uint8_t* __restrict__ occupied,  // [Gx, Gy, Gz]
    const int64_t* __restrict__ offsets,   // [R + 1]
    float* __restrict__ ts,                // [S]
    float* __restrict__ deltas,            // [S]
    float* __restrict__ positions,         // [S, 3]
    int64_t* __restrict__ ray_indices) {   // [S]
  const int64_t ray = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ray >= num_rays) return;
  const int64_t base = offsets[ray];
  if (offsets[ray + 1] == base) return;
  const int64_t kept = march_ray<true>(origins + 3 * ray, directions + 3 * ray, near[ray],
                                       far[ray], grid, occupied, step_size, cone_angle, max_step,
                                       contract, max_samples, ray, base, ts, deltas, positions, ray_indices);
  CUDA_KERNEL_ASSERT_MSG(kept == offsets[ray + 1] - base,
                         "ray_march: the fill pass disagrees with the count pass");
}

unsigned blocks_for(int64_t num_rays) {
  return static_cast<unsigned>((num_rays + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

// Launchers: the stream is explicit; nothing is launched for R == 0.
void launch_count(const torch::Tensor& o, const torch::Tensor& d, const torch::Tensor& near,
                  const torch::Tensor& far, const torch::Tensor& occ, const Grid& grid,
                  const RayMarchParams& p, const torch::Tensor& counts, cudaStream_t stream) {
  const int64_t num_rays = o.size(0);
  if (num_rays == 0) return;
  ray_march_count_kernel<<<blocks_for(num_rays), kThreadsPerBlock, 0, stream>>>(
      num_rays, grid, p.step_size, p.cone_angle, p.max_step, p.contract, p.max_samples_per_ray,
      o.data_ptr<float>(), d.data_ptr<float>(), near.data_ptr<float>(), far.data_ptr<float>(),
      occ.data_ptr<uint8_t>(), counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_fill(const torch::Tensor& o, const torch::Tensor& d, const torch::Tensor& near,
                 const torch::Tensor& far, const torch::Tensor& occ, const Grid& grid,
                 const RayMarchParams& p, const RayMarchOutput& out, cudaStream_t stream) {
  const int64_t num_rays = o.size(0);
  if (num_rays == 0 || out.ts.numel() == 0) return;
  ray_march_fill_kernel<<<blocks_for(num_rays), kThreadsPerBlock, 0, stream>>>(
      num_rays, grid, p.step_size, p.cone_angle, p.max_step, p.contract, p.max_samples_per_ray,
      o.data_ptr<float>(), d.data_ptr<float>(), near.data_ptr<float>(), far.data_ptr<float>(),
      occ.data_ptr<uint8_t>(), out.ray_offsets.data_ptr<int64_t>(), out.ts.data_ptr<float>(),
      out.deltas.data_ptr<float>(), out.positions.data_ptr<float>(),
      out.ray_indices.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

RayMarchOutput ray_march_fwd(const torch::Tensor& origins, const torch::Tensor& directions,
                             const torch::Tensor& near, const torch::Tensor& far,
                             const torch::Tensor& aabb, const torch::Tensor& occupancy,
                             const RayMarchParams& params) {
  const c10::cuda::CUDAGuard guard(origins.device());
  const torch::Tensor o = origins.contiguous(), d = directions.contiguous(),
                      t_near = near.contiguous(), t_far = far.contiguous();
  torch::Tensor occ = occupancy.contiguous();
  if (occ.scalar_type() == torch::kBool) occ = occ.view(torch::kUInt8);  // same bytes, 0 or 1
  const torch::Tensor box = aabb.to(torch::kCPU).contiguous();
  const float* b = box.data_ptr<float>();
  Grid grid;
  for (int a = 0; a < 3; ++a) {
    grid.lo[a] = b[a];
    grid.hi[a] = b[a + 3];
    grid.res[a] = occ.size(a);
    // As the CPU's make_grid: contracted space spans [-2, 2] and the aabb only clips.
    const float cell_lo = params.contract ? -2.0f : grid.lo[a];
    const float cell_hi = params.contract ? 2.0f : grid.hi[a];
    grid.cell_lo[a] = cell_lo;
    grid.scale[a] = static_cast<float>(grid.res[a]) / (cell_hi - cell_lo);
  }
  const int64_t num_rays = o.size(0);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto i64 = o.options().dtype(torch::kInt64);

  // Pass 1: counts, then the exclusive scan: ray_offsets = [0, cumsum(counts)].
  const torch::Tensor counts = torch::empty({num_rays}, i64);
  launch_count(o, d, t_near, t_far, occ, grid, params, counts, stream);
  RayMarchOutput out;
  out.ray_offsets = torch::zeros({num_rays + 1}, i64);
  if (num_rays > 0) {
    torch::Tensor tail = out.ray_offsets.slice(0, 1);  // [R], a view: the scan writes in place
    torch::cumsum_out(tail, counts, 0);
  }
  const int64_t num_samples = out.ray_offsets[num_rays].item<int64_t>();  // syncs once

  // Pass 2: march again, writing each ray's samples at its offset.
  const auto f32 = o.options();
  out.ts = torch::empty({num_samples}, f32);
  out.deltas = torch::empty({num_samples}, f32);
  out.positions = torch::empty({num_samples, 3}, f32);
  out.ray_indices = torch::empty({num_samples}, i64);
  launch_fill(o, d, t_near, t_far, occ, grid, params, out, stream);
  return out;
}

}  // namespace tessera::kernels::cuda
