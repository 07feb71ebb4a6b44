// CPU bin_gaussians_fwd: count tiles per Gaussian, scan, fill the tiles of each Gaussian, sort the
// Gaussians once by (depth, id), then a stable counting sort of their intersections by tile taken
// in that order: every tile's list comes out sorted by (depth, id) without sorting M entries.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/gaussian_raster_math.h"
#include "kernels/tile_binning.h"

namespace tessera::kernels::cpu {

namespace {

// Gaussians per task of the count and fill passes: each costs a few ns plus its tiles.
constexpr int64_t kGaussiansPerTask = 4096;

template <typename scalar_t>
TileBins bin(const torch::Tensor& means2d, const torch::Tensor& radii_t,
             const torch::Tensor& depths_t, int64_t width, int64_t height, int64_t tile_size,
             const torch::Tensor& mask_t) {
  const int64_t n = means2d.size(0);
  const int64_t tiles_x = tiles_along(width, tile_size), tiles_y = tiles_along(height, tile_size);
  const int64_t num_tiles = tiles_x * tiles_y;
  const scalar_t* means = means2d.data_ptr<scalar_t>();
  const int32_t* radii = radii_t.data_ptr<int32_t>();
  const scalar_t* depths = depths_t.data_ptr<scalar_t>();
  const bool* mask = mask_t.defined() ? mask_t.data_ptr<bool>() : nullptr;

  // 1. Intersections per Gaussian (masked-out tiles not counted).
  std::vector<int64_t> first(n + 1, 0);
  tessera::parallel_for(0, n, kGaussiansPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const raster::TileRect r =
          raster::gaussian_tile_rect(means, radii, depths, g, tile_size, tiles_x, tiles_y);
      const int64_t count = raster::unmasked_tiles(r, mask, tiles_x);
      first[g + 1] = count;
    }
  });
  // 2. Exclusive scan: Gaussian g's intersections go to [first[g], first[g + 1]).
  for (int64_t g = 0; g < n; ++g) first[g + 1] += first[g];
  const int64_t m = first[n];

  // 3. Fill the tile of each intersection, in Gaussian order (ids ascending).
  std::vector<int64_t> tile_of(m);
  tessera::parallel_for(0, n, kGaussiansPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const raster::TileRect r =
          raster::gaussian_tile_rect(means, radii, depths, g, tile_size, tiles_x, tiles_y);
      int64_t k = first[g];
      for (int64_t ty = r.y0; ty < r.y1; ++ty)
        for (int64_t tx = r.x0; tx < r.x1; ++tx) {
          const int64_t t = ty * tiles_x + tx;
          if (!mask || mask[t]) tile_of[k++] = t;
        }
    }
  });

  // 4. The Gaussians with intersections by (depth, id): a strict total order (culled Gaussians
  //    with non-finite depths have none), so the result does not depend on the sort algorithm
  //    or the threads. One sort of at most N keys instead of one per tile of M entries.
  std::vector<std::pair<scalar_t, int64_t>> order;
  order.reserve(n);
  for (int64_t g = 0; g < n; ++g)
    if (first[g + 1] > first[g]) order.emplace_back(depths[g], g);
  std::sort(order.begin(), order.end());

  // 5. Stable counting sort by tile of the intersections taken in (depth, id) order: within a
  //    tile the ids come out in that order. Sequential, O(M + T).
  TileBins out;
  out.tile_offsets = torch::zeros({num_tiles + 1}, torch::kInt64);
  out.gaussian_ids = torch::empty({m}, torch::kInt64);
  int64_t* offsets = out.tile_offsets.data_ptr<int64_t>();
  int64_t* ids = out.gaussian_ids.data_ptr<int64_t>();
  for (int64_t k = 0; k < m; ++k) ++offsets[tile_of[k] + 1];
  for (int64_t t = 0; t < num_tiles; ++t) offsets[t + 1] += offsets[t];
  {
    std::vector<int64_t> cursor(offsets, offsets + num_tiles);
    for (const auto& [depth, g] : order)
      for (int64_t k = first[g]; k < first[g + 1]; ++k) ids[cursor[tile_of[k]]++] = g;
  }
  return out;
}

}  // namespace

TileBins bin_gaussians_fwd(const torch::Tensor& means2d, const torch::Tensor& radii,
                           const torch::Tensor& depths, int64_t width, int64_t height,
                           int64_t tile_size, const torch::Tensor& tile_mask) {
  const torch::Tensor m = means2d.contiguous(), r = radii.contiguous(), d = depths.contiguous();
  const torch::Tensor mask = tile_mask.defined() ? tile_mask.contiguous() : tile_mask;
  TileBins out;
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "bin_gaussians_cpu", [&] {
    out = bin<scalar_t>(m, r, d, width, height, tile_size, mask);
  });
  return out;
}

}  // namespace tessera::kernels::cpu
