// tile_binning: which projected 3D Gaussians touch which screen tile, each tile's list sorted by
// depth (front to back), as 3DGS rasterization (kernels/gaussian_rasterize.h) consumes it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::kernels {

// Tiles are tile_size x tile_size pixels, row-major: tile t = ty * tiles_x + tx covers the pixels
// (row i, col j) with i / tile_size == ty and j / tile_size == tx; tiles_x = ceil(width /
// tile_size), tiles_y = ceil(height / tile_size), T = tiles_x * tiles_y (the last row and column
// of tiles may stick out of the image).
constexpr int64_t kDefaultTileSize = 16;

// Packed per-tile lists of Gaussians. M is the number of (tile, Gaussian) intersections kept.
struct TileBins {
  at::Tensor tile_offsets;  // [T + 1] int64: tile t owns entries [off[t], off[t + 1]); off[0] = 0
  at::Tensor gaussian_ids;  // [M]     int64: Gaussian ids, per tile by depth ascending, ties
                               //         by Gaussian id ascending
};

// The rule (shared by the CPU and CUDA implementations, kernels/gaussian_raster_math.h):
//  1. Gaussian g is culled (touches nothing) when radii[g] <= 0, or means2d[g] or depths[g] is not
//     finite.
//  2. Otherwise it touches the tiles [x0, x1) x [y0, y1) of its bounding square, centre
//     means2d[g] and half-width radii[g] pixels, by the gsplat/INRIA getRect rule computed in
//     double: x0 = clamp(floor((mx - r) / ts), 0, tiles_x), x1 = clamp(floor((mx + r + ts - 1) /
//     ts), 0, tiles_x), and likewise y0, y1 with my and tiles_y.
//  3. When tile_mask is defined, intersections with tiles where tile_mask[t] is false are dropped
//     (a rank renders only its block of tiles); their lists are empty.
//  4. Each tile's list is sorted by depth ascending, equal depths (-0 equals +0) by Gaussian id
//     ascending: the output is fully determined by the inputs, on either device and for any
//     thread count.
// Not differentiable: the outputs are integers and no gradient flows through them.
// Dispatches by the device of means2d (CPU or CUDA); the CUDA version reads M back to the host
// (one synchronization).
TileBins bin_gaussians(
    const at::Tensor& means2d,    // [N, 2] float32 or float64, pixel coordinates (x, y)
    const at::Tensor& radii,      // [N]    int32, 0 = culled
    const at::Tensor& depths,     // [N]    the dtype of means2d, camera-space z
    int64_t width, int64_t height,   // image size in pixels, >= 0
    int64_t tile_size = kDefaultTileSize,  // >= 1
    const at::Tensor& tile_mask = {});  // [T] bool, or undefined for all tiles

// The number of tiles along x and y for an image, and T.
inline int64_t tiles_along(int64_t pixels, int64_t tile_size) {
  return (pixels + tile_size - 1) / tile_size;
}

// The two implementations take the same arguments and return the same tensors. They expect
// inputs validated by bin_gaussians (shapes, dtypes, one device) and accept any strides.
namespace cpu {
// Count per Gaussian, exclusive scan, fill, a stable counting sort by tile, then each tile's
// list sorted by (depth, id) in parallel over tiles.
TileBins bin_gaussians_fwd(
    const at::Tensor& means2d,    // [N, 2]
    const at::Tensor& radii,      // [N] int32
    const at::Tensor& depths,     // [N]
    int64_t width, int64_t height, int64_t tile_size,
    const at::Tensor& tile_mask);  // [T] bool or undefined
}  // namespace cpu

namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA). Counts per Gaussian, scan, fills 64-bit
// keys tile << 32 | depth rank (the rank of (depth, id) from a stable sort of the depths) and
// sorts them; the current stream.
TileBins bin_gaussians_fwd(
    const at::Tensor& means2d,    // [N, 2]
    const at::Tensor& radii,      // [N] int32
    const at::Tensor& depths,     // [N]
    int64_t width, int64_t height, int64_t tile_size,
    const at::Tensor& tile_mask);  // [T] bool or undefined
}  // namespace cuda

}  // namespace tessera::kernels
