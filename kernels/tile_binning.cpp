// tile_binning's entry point: input checks (shapes, dtypes, devices, image and tile sizes) and the
// dispatch between the CPU and CUDA implementations.
#include "kernels/tile_binning.h"
#include "kernels/device_dispatch.h"

#include <torch/autograd.h>

namespace tessera::kernels {

namespace {

void check_inputs(const torch::Tensor& means2d, const torch::Tensor& radii,
                  const torch::Tensor& depths, int64_t width, int64_t height, int64_t tile_size,
                  const torch::Tensor& tile_mask) {
  TORCH_CHECK(means2d.dim() == 2 && means2d.size(1) == 2,
              "bin_gaussians: means2d must be [N, 2], got ", means2d.sizes());
  const int64_t n = means2d.size(0);
  TORCH_CHECK(radii.dim() == 1 && radii.size(0) == n,
              "bin_gaussians: radii must be [N] with N = ", n, ", got ", radii.sizes());
  TORCH_CHECK(depths.dim() == 1 && depths.size(0) == n,
              "bin_gaussians: depths must be [N] with N = ", n, ", got ", depths.sizes());
  const auto dtype = means2d.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat64,
              "bin_gaussians: means2d must be float32 or float64, got ", dtype);
  TORCH_CHECK(depths.scalar_type() == dtype, "bin_gaussians: depths must have the dtype of "
              "means2d (", dtype, "), got ", depths.scalar_type());
  TORCH_CHECK(radii.scalar_type() == torch::kInt32,
              "bin_gaussians: radii must be int32, got ", radii.scalar_type());
  TORCH_CHECK(width >= 0 && height >= 0, "bin_gaussians: width and height must be >= 0, got ",
              width, " x ", height);
  TORCH_CHECK(tile_size >= 1 && tile_size <= (int64_t{1} << 20),
              "bin_gaussians: tile_size must be in [1, 2^20], got ", tile_size);
  const int64_t num_tiles = tiles_along(width, tile_size) * tiles_along(height, tile_size);
  TORCH_CHECK(num_tiles < (int64_t{1} << 31), "bin_gaussians: ", num_tiles,
              " tiles is too many (at most 2^31 - 1)");
  TORCH_CHECK(n < (int64_t{1} << 32), "bin_gaussians: at most 2^32 - 1 Gaussians, got ", n);
  for (const torch::Tensor* t : {&radii, &depths})
    TORCH_CHECK(t->device() == means2d.device(), "bin_gaussians: all inputs must be on ",
                means2d.device(), ", got one on ", t->device());
  if (tile_mask.defined()) {
    TORCH_CHECK(tile_mask.dim() == 1 && tile_mask.size(0) == num_tiles,
                "bin_gaussians: tile_mask must be [T] with T = ", num_tiles, " (",
                tiles_along(width, tile_size), " x ", tiles_along(height, tile_size),
                " tiles), got ", tile_mask.sizes());
    TORCH_CHECK(tile_mask.scalar_type() == torch::kBool,
                "bin_gaussians: tile_mask must be bool, got ", tile_mask.scalar_type());
    TORCH_CHECK(tile_mask.device() == means2d.device(), "bin_gaussians: tile_mask must be on ",
                means2d.device(), ", got ", tile_mask.device());
  }
}

}  // namespace

TileBins bin_gaussians(const torch::Tensor& means2d, const torch::Tensor& radii,
                       const torch::Tensor& depths, int64_t width, int64_t height,
                       int64_t tile_size, const torch::Tensor& tile_mask) {
  check_inputs(means2d, radii, depths, width, height, tile_size, tile_mask);
  const torch::NoGradGuard no_grad;  // integer outputs: no graph, whatever the inputs
  const torch::Tensor m = means2d.detach(), d = depths.detach();
  return on_device(
      "bin_gaussians", means2d,
      [&] { return cpu::bin_gaussians_fwd(m, radii, d, width, height, tile_size, tile_mask); },
      [&] { return cuda::bin_gaussians_fwd(m, radii, d, width, height, tile_size, tile_mask); });
}

}  // namespace tessera::kernels
