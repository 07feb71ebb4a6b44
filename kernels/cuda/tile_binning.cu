// CUDA bin_gaussians_fwd: count tiles per Gaussian, scan, fill 64-bit keys tile << 32 | depth
// rank and sort them (as gsplat and INRIA 3DGS do with a radix sort), then per-tile offsets.
#include <ATen/Dispatch.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/gaussian_raster_math.h"
#include "kernels/tile_binning.h"

namespace tessera::kernels::cuda {

namespace {

constexpr int kThreadsPerBlock = 256;

// One thread per Gaussian: its number of (unmasked) tiles.
template <typename scalar_t>
__global__ void count_kernel(int64_t n, int64_t tile_size, int64_t tiles_x, int64_t tiles_y,
                             const scalar_t* __restrict__ means,  // [N, 2]
                             const int32_t* __restrict__ radii,   // [N]
                             const scalar_t* __restrict__ depths, // [N]
                             const bool* __restrict__ mask,       // [T] or null
                             int64_t* __restrict__ counts) {      // [N]
  const int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (g >= n) return;
  counts[g] = raster::unmasked_tiles(
      raster::gaussian_tile_rect(means, radii, depths, g, tile_size, tiles_x, tiles_y), mask,
      tiles_x);
}

// One thread per Gaussian: key tile << 32 | rank and value g for each of its intersections,
// written in tile order from the Gaussian's start (the exclusive scan, ends[g - 1]).
template <typename scalar_t>
__global__ void fill_kernel(int64_t n, int64_t tile_size, int64_t tiles_x, int64_t tiles_y,
                            const scalar_t* __restrict__ means,   // [N, 2]
                            const int32_t* __restrict__ radii,    // [N]
                            const scalar_t* __restrict__ depths,  // [N]
                            const bool* __restrict__ mask,        // [T] or null
                            const int64_t* __restrict__ ends,     // [N] inclusive scan of counts
                            const int64_t* __restrict__ ranks,    // [N] depth rank
                            int64_t* __restrict__ keys,           // [M]
                            int64_t* __restrict__ values) {       // [M]
  const int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (g >= n) return;
  const raster::TileRect r =
      raster::gaussian_tile_rect(means, radii, depths, g, tile_size, tiles_x, tiles_y);
  int64_t k = g == 0 ? 0 : ends[g - 1];
  const int64_t rank = ranks[g];
  for (int64_t ty = r.y0; ty < r.y1; ++ty)
    for (int64_t tx = r.x0; tx < r.x1; ++tx) {
      const int64_t t = ty * tiles_x + tx;
      if (mask && !mask[t]) continue;
      keys[k] = (t << 32) | rank;
      values[k] = g;
      ++k;
    }
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

}  // namespace

TileBins bin_gaussians_fwd(const at::Tensor& means2d, const at::Tensor& radii,
                           const at::Tensor& depths, int64_t width, int64_t height,
                           int64_t tile_size, const at::Tensor& tile_mask) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  const at::Tensor m = means2d.contiguous(), r = radii.contiguous();
  // +0.0 turns -0.0 into +0.0: the radix sort below would order -0 before +0, the CPU does not.
  const at::Tensor d = depths.contiguous() + 0.0;
  const at::Tensor mask = tile_mask.defined() ? tile_mask.contiguous() : tile_mask;
  const int64_t n = m.size(0);
  const int64_t tiles_x = tiles_along(width, tile_size), tiles_y = tiles_along(height, tile_size);
  const int64_t num_tiles = tiles_x * tiles_y;
  const auto i64 = m.options().dtype(at::kLong);
  TileBins out;
  if (n == 0) {
    out.tile_offsets = at::zeros({num_tiles + 1}, i64);
    out.gaussian_ids = at::empty({0}, i64);
    return out;
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool* mask_ptr = mask.defined() ? mask.data_ptr<bool>() : nullptr;

  // Depth rank of every Gaussian: position in a stable sort by depth, so ties go by id.
  const at::Tensor order =
      std::get<1>(at::sort(d, /*stable=*/std::optional<bool>(true), /*dim=*/0));
  const at::Tensor ranks = at::empty({n}, i64).scatter_(0, order, at::arange(n, i64));

  at::Tensor counts = at::empty({n}, i64);
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "bin_gaussians_count_cuda", [&] {
    count_kernel<scalar_t><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
        n, tile_size, tiles_x, tiles_y, m.data_ptr<scalar_t>(), r.data_ptr<int32_t>(),
        d.data_ptr<scalar_t>(), mask_ptr, counts.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  const at::Tensor ends = at::cumsum(counts, 0);
  const int64_t num_isects = ends[n - 1].item<int64_t>();  // synchronizes once
  if (num_isects == 0) {
    out.tile_offsets = at::zeros({num_tiles + 1}, i64);
    out.gaussian_ids = at::empty({0}, i64);
    return out;
  }
  at::Tensor keys = at::empty({num_isects}, i64);
  at::Tensor values = at::empty({num_isects}, i64);
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "bin_gaussians_fill_cuda", [&] {
    fill_kernel<scalar_t><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
        n, tile_size, tiles_x, tiles_y, m.data_ptr<scalar_t>(), r.data_ptr<int32_t>(),
        d.data_ptr<scalar_t>(), mask_ptr, ends.data_ptr<int64_t>(), ranks.data_ptr<int64_t>(),
        keys.data_ptr<int64_t>(), values.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  // Keys are unique (one per (tile, Gaussian)), so the order is fully determined.
  const auto [sorted_keys, perm] =
      at::sort(keys, /*stable=*/std::optional<bool>(true), /*dim=*/0);
  out.gaussian_ids = values.index_select(0, perm);
  const at::Tensor sorted_tiles = sorted_keys.bitwise_right_shift(32);
  out.tile_offsets = at::searchsorted(sorted_tiles, at::arange(num_tiles + 1, i64));
  return out;
}

}  // namespace tessera::kernels::cuda
