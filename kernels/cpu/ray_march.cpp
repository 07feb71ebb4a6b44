// CPU ray_march_fwd: two passes over the rays with at::parallel_for (count, then fill at the
// offsets of an exclusive scan), so the output is the same for every thread count. The marching
// rule of one ray is kernels/ray_march_math.h, shared with CUDA.
//
// No empty-space skipping: jumping over an empty cell with results identical to the plain rule
// needs the cell's exit t in double with a rounding margin at every empty lookup. Measured with
// instant-ngp's step (about 4.6 steps per cell of a 128^3 grid), it made bench_ray_march's sparse
// scene 2.7x slower (64 vs 24 ms of CPU), so it pays only for coarse grids or fine steps.
#include "kernels/cpu/parallel.h"
#include "kernels/ray_march.h"
#include "kernels/ray_march_math.h"

#include <ATen/Parallel.h>


namespace tessera::kernels::cpu {

namespace {

// Rays per parallel task. A ray costs from a few steps (a miss) to a few thousand (a long ray
// through a fine grid) at a few ns a step, so rays vary a lot: 64 rays are tens of microseconds,
// well above the cost of handing out a task, and a 4096-ray batch still splits into 64 tasks,
// enough to even out long and short rays over the cores.
constexpr int64_t kRaysPerTask = 64;

using march::Grid;

Grid make_grid(const torch::Tensor& aabb,         // [6] on the CPU
               const torch::Tensor& occupancy,    // [Gx, Gy, Gz] contiguous uint8
               bool contract) {
  const int64_t res[3] = {occupancy.size(0), occupancy.size(1), occupancy.size(2)};
  Grid g = march::make_grid(aabb.data_ptr<float>(), res, contract);
  g.occupied = occupancy.data_ptr<uint8_t>();
  return g;
}

}  // namespace

RayMarchOutput ray_march_fwd(const torch::Tensor& origins, const torch::Tensor& directions,
                             const torch::Tensor& near, const torch::Tensor& far,
                             const torch::Tensor& aabb, const torch::Tensor& occupancy,
                             const RayMarchParams& params) {
  const torch::Tensor o = origins.contiguous(), d = directions.contiguous(),
                      t_near = near.contiguous(), t_far = far.contiguous();
  torch::Tensor occ = occupancy.contiguous();
  if (occ.scalar_type() == torch::kBool) occ = occ.view(torch::kUInt8);  // same bytes, 0 or 1
  const Grid grid = make_grid(aabb.contiguous(), occ, params.contract);
  const int64_t num_rays = o.size(0);
  const float* po = o.data_ptr<float>();
  const float* pd = d.data_ptr<float>();
  const float* pn = t_near.data_ptr<float>();
  const float* pf = t_far.data_ptr<float>();
  const auto no_emit = [](int64_t, float, float, float, float, float) {};

  // Pass 1: counts into ray_offsets[r + 1], then an in-place inclusive scan (exclusive overall).
  RayMarchOutput out;
  out.ray_offsets = torch::zeros({num_rays + 1}, torch::dtype(torch::kInt64));
  int64_t* offsets = out.ray_offsets.data_ptr<int64_t>();
  tessera::parallel_for(0, num_rays, kRaysPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      offsets[r + 1] =
          march::march_ray(po + 3 * r, pd + 3 * r, pn[r], pf[r], grid, params, no_emit);
  });
  for (int64_t r = 0; r < num_rays; ++r) offsets[r + 1] += offsets[r];
  const int64_t num_samples = offsets[num_rays];

  // Pass 2: march again, writing each ray's samples at its offset.
  const auto f32 = torch::dtype(torch::kFloat32);
  out.ts = torch::empty({num_samples}, f32);
  out.deltas = torch::empty({num_samples}, f32);
  out.positions = torch::empty({num_samples, 3}, f32);
  out.ray_indices = torch::empty({num_samples}, torch::dtype(torch::kInt64));
  float* ts = out.ts.data_ptr<float>();
  float* deltas = out.deltas.data_ptr<float>();
  float* positions = out.positions.data_ptr<float>();
  int64_t* ray_indices = out.ray_indices.data_ptr<int64_t>();
  tessera::parallel_for(0, num_rays, kRaysPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t base = offsets[r];
      const int64_t count = offsets[r + 1] - base;
      if (count == 0) continue;
      const march::SampleWriter emit{ts, deltas, positions, ray_indices, base, r};
      const int64_t again =
          march::march_ray(po + 3 * r, pd + 3 * r, pn[r], pf[r], grid, params, emit);
      TORCH_CHECK(again == count, "ray_march: ray ", r, " gave ", count, " samples, then ", again);
    }
  });
  return out;
}

}  // namespace tessera::kernels::cpu
