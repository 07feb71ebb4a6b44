// gaussian_rasterize: tile-based front-to-back alpha compositing of depth-sorted 2D Gaussians into
// an image (3D Gaussian Splatting, as in INRIA 3DGS and gsplat), differentiable.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/tile_binning.h"

namespace tessera::kernels {

// The rule, per pixel (row i, col j) with centre (px, py) = (j + 0.5, i + 0.5), in tile t (see
// kernels/tile_binning.h), walking the entries k = 0, 1, ... of t's list [off[t], off[t + 1])
// with g = gaussian_ids[off[t] + k], T = 1 at the start:
//   dx = means2d[g].x - px, dy = means2d[g].y - py, (a, b, c) = conics[g];
//   sigma = 0.5 * (a dx^2 + c dy^2) + b dx dy;          skip the entry if sigma < 0;
//   alpha = min(kMaxAlpha = 0.99, opacities[g] * exp(-sigma));
//                                                     skip the entry if alpha < kMinAlpha = 1/255;
//   if T * (1 - alpha) < kTransmittanceStop = 1e-4:   stop, before adding this entry (INRIA);
//   colour += T * alpha * colors[g];   T *= 1 - alpha.
// Outputs: colors = colour + T_final * background, alphas = 1 - T_final, and last_ids = 1 + the
// position k of the last entry added (0 if none): backward walks k = last_ids - 1 down to 0.
// The constants and the per-pair math live in kernels/gaussian_raster_math.h (raster::).
// Pixels of tiles with an empty list (no Gaussian, or masked out at binning) get the background.
struct RasterizeOutput {
  at::Tensor colors;         // [H, W, C] composited over the background (differentiable)
  at::Tensor alphas;         // [H, W]    1 - T_final (differentiable)
  at::Tensor last_ids;       // [H, W]    int32, entries of the tile list up to the last added
  at::Tensor transmittance;  // [H, W]    T_final, exactly (alphas = 1 - it, rounded); saved
                                //           for backward, not differentiable
};

// The differentiable op. Dispatches by the device of means2d (CPU or CUDA).
//   Float inputs: one dtype (float32 or float64), one device, any strides. tile_offsets and
//   gaussian_ids come from bin_gaussians with the same width, height and tile_size (checked:
//   sizes, tile_offsets[0] == 0, monotone, tile_offsets[T] == M, ids in [0, N); on CUDA the
//   contents by device asserts).
// Gradients flow to means2d, conics, colors and opacities from colors and alphas, and to the
// background (when given) from colors; undefined grad outputs count as zero.
//
// Densification: the gradient that reaches means2d, v_means2d [N, 2], is the screen-space
// (pixel-unit) gradient whose norm 3DGS accumulates per Gaussian to decide where to clone and
// split. INRIA's threshold (0.0002) is for the gradient in NDC units: use densify_grad_norm below.
// Backward recomputes each pixel's state from T_final and last_ids walking back to front
// (gsplat style); nothing per pixel and Gaussian is stored.
RasterizeOutput rasterize_gaussians(
    const at::Tensor& means2d,       // [N, 2] pixel coordinates (x, y)
    const at::Tensor& conics,        // [N, 3] (a, b, c) of the inverse 2D covariance
    const at::Tensor& colors,        // [N, C] C >= 1
    const at::Tensor& opacities,     // [N]    activated, in [0, 1]
    const at::Tensor& background,    // [C]    or undefined (zeros)
    const at::Tensor& tile_offsets,  // [T + 1] int64, from bin_gaussians
    const at::Tensor& gaussian_ids,  // [M]     int64, from bin_gaussians
    int64_t width, int64_t height, int64_t tile_size = kDefaultTileSize);

// ||(v_x * width / 2, v_y * height / 2)|| per Gaussian: the norm of the screen-space gradient in
// NDC units, the quantity INRIA 3DGS compares with densify_grad_threshold (gsplat's
// DefaultStrategy rescales the same way). v_means2d is means2d.grad().
at::Tensor densify_grad_norm(const at::Tensor& v_means2d,  // [N, 2]
                                int64_t width, int64_t height);

// Gradients of the backward pass.
struct RasterizeGrads {
  at::Tensor v_means2d;     // [N, 2] screen-space gradient (see densification above)
  at::Tensor v_conics;      // [N, 3]
  at::Tensor v_colors;      // [N, C]
  at::Tensor v_opacities;   // [N]
  at::Tensor v_background;  // [C], undefined when background is undefined
};

// The two implementations take the same arguments and return the same tensors. They expect
// inputs validated by rasterize_gaussians and accept any strides; accumulation is in the inputs'
// dtype. In backward an undefined grad output counts as zero.
namespace cpu {
// Parallel over tiles (at::parallel_for); each tile gathers the Gaussians that can reach its
// pixels, which walk them in vectorized row segments (docs/gaussian_kernels.md). Backward writes
// the gradient of each (pixel tile, Gaussian) entry some pixel reached into a buffer row of its
// own, then sums the entries of each Gaussian in entry order (a stable grouping by id): no
// atomics, and bitwise identical results for any thread count.
RasterizeOutput rasterize_gaussians_fwd(
    // forward inputs
    const at::Tensor& means2d,       // [N, 2]
    const at::Tensor& conics,        // [N, 3]
    const at::Tensor& colors,        // [N, C]
    const at::Tensor& opacities,     // [N]
    const at::Tensor& background,    // [C] or undefined
    const at::Tensor& tile_offsets,  // [T + 1] int64
    const at::Tensor& gaussian_ids,  // [M] int64
    int64_t width, int64_t height, int64_t tile_size);

RasterizeGrads rasterize_gaussians_bwd(
    // forward inputs
    const at::Tensor& means2d,        // [N, 2]
    const at::Tensor& conics,         // [N, 3]
    const at::Tensor& colors,         // [N, C]
    const at::Tensor& opacities,      // [N]
    const at::Tensor& background,     // [C] or undefined
    const at::Tensor& tile_offsets,   // [T + 1] int64
    const at::Tensor& gaussian_ids,   // [M] int64
    int64_t width, int64_t height, int64_t tile_size,
    // forward outputs
    const at::Tensor& last_ids,       // [H, W] int32
    const at::Tensor& transmittance,  // [H, W]
    // grad outputs (each may be undefined)
    const at::Tensor& v_colors,       // [H, W, C]
    const at::Tensor& v_alphas);      // [H, W]
}  // namespace cpu

namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA). One block of tile_size x tile_size
// threads per tile (tile_size <= 32), Gaussians staged through shared memory in batches; the
// backward adds per-Gaussian gradients with integer atomicAdd in fixed point (float32: bitwise
// from run to run; float64: float atomicAdd), equal to the CPU up to reassociation.
RasterizeOutput rasterize_gaussians_fwd(
    // forward inputs
    const at::Tensor& means2d,       // [N, 2]
    const at::Tensor& conics,        // [N, 3]
    const at::Tensor& colors,        // [N, C]
    const at::Tensor& opacities,     // [N]
    const at::Tensor& background,    // [C] or undefined
    const at::Tensor& tile_offsets,  // [T + 1] int64
    const at::Tensor& gaussian_ids,  // [M] int64
    int64_t width, int64_t height, int64_t tile_size);

RasterizeGrads rasterize_gaussians_bwd(
    // forward inputs
    const at::Tensor& means2d,        // [N, 2]
    const at::Tensor& conics,         // [N, 3]
    const at::Tensor& colors,         // [N, C]
    const at::Tensor& opacities,      // [N]
    const at::Tensor& background,     // [C] or undefined
    const at::Tensor& tile_offsets,   // [T + 1] int64
    const at::Tensor& gaussian_ids,   // [M] int64
    int64_t width, int64_t height, int64_t tile_size,
    // forward outputs
    const at::Tensor& last_ids,       // [H, W] int32
    const at::Tensor& transmittance,  // [H, W]
    // grad outputs (each may be undefined)
    const at::Tensor& v_colors,       // [H, W, C]
    const at::Tensor& v_alphas);      // [H, W]
}  // namespace cuda

}  // namespace tessera::kernels
