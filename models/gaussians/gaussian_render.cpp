// render_gaussians: one view through the kernels (project -> SH -> bin -> rasterize), with the
// screen-space gradient of means2d kept for densification (see gaussian_render.h).
#include "models/gaussians/gaussian_render.h"

#include <torch/nn/functional.h>

#include <cmath>
#include <stdexcept>

#include "kernels/gaussian_rasterize.h"
#include "kernels/spherical_harmonics.h"

namespace tessera::models::gaussians {

RenderCamera make_render_camera(const data::Camera& camera, double downscale,
                                torch::Device device) {
  if (!(downscale >= 1.0) || !std::isfinite(downscale))
    throw std::invalid_argument("make_render_camera: downscale must be a finite value >= 1");
  RenderCamera out;
  const auto& m = camera.camera_to_world;  // row-major [R t; 0 1]
  double view[16] = {0};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) view[r * 4 + c] = m[c * 4 + r];  // R^T
    view[r * 4 + 3] = -(m[0 * 4 + r] * m[3] + m[1 * 4 + r] * m[7] + m[2 * 4 + r] * m[11]);
  }
  view[15] = 1.0;
  out.viewmat = torch::from_blob(view, {4, 4}, torch::kFloat64).to(torch::kFloat32).to(device);
  out.centre = {m[3], m[7], m[11]};
  out.width = std::max<int64_t>(1, std::llround(camera.width / downscale));
  out.height = std::max<int64_t>(1, std::llround(camera.height / downscale));
  const double sx = static_cast<double>(out.width) / camera.width;
  const double sy = static_cast<double>(out.height) / camera.height;
  out.fx = camera.fx * sx;
  out.cx = camera.cx * sx;
  out.fy = camera.fy * sy;
  out.cy = camera.cy * sy;
  return out;
}

RenderOutput render_gaussians(const GaussianParams& params, const RenderCamera& camera,
                              const RenderOptions& options) {
  if (options.sh_degree < 0 || options.sh_degree > kMaxShDegree)
    throw std::invalid_argument("render_gaussians: sh_degree must be in [0, 3]");
  const torch::Tensor scales = params.scales();
  const kernels::ProjectionOutput proj = kernels::project_gaussians(
      params.means, params.quats, scales, camera.viewmat, camera.fx, camera.fy, camera.cx,
      camera.cy, camera.width, camera.height, options.near_plane, options.far_plane,
      options.eps2d);
  RenderOutput out;
  out.width = camera.width;
  out.height = camera.height;
  out.radii = proj.radii;
  out.means2d = proj.means2d;
  out.depths = proj.depths;
  if (out.means2d.requires_grad()) out.means2d.retain_grad();

  const torch::Tensor centre =
      torch::tensor({camera.centre[0], camera.centre[1], camera.centre[2]},
                    params.means.options().requires_grad(false));
  const torch::Tensor dirs = params.means - centre;  // [N, 3]
  const torch::Tensor colors =
      kernels::spherical_harmonics(options.sh_degree, dirs, params.sh_dc, params.sh_rest);
  const kernels::TileBins bins =
      kernels::bin_gaussians(proj.means2d.detach(), proj.radii, proj.depths.detach(),
                             camera.width, camera.height, options.tile_size, options.tile_mask);
  const kernels::RasterizeOutput raster = kernels::rasterize_gaussians(
      proj.means2d, proj.conics, colors, params.opacities(), options.background,
      bins.tile_offsets, bins.gaussian_ids, camera.width, camera.height, options.tile_size);
  out.image = raster.colors;
  out.alphas = raster.alphas;
  return out;
}

torch::Tensor resize_image(const torch::Tensor& image, int64_t width, int64_t height) {
  if (image.dim() != 3) throw std::invalid_argument("resize_image: expected [H, W, C]");
  if (image.size(0) == height && image.size(1) == width) return image;
  namespace F = torch::nn::functional;
  const torch::Tensor chw = image.permute({2, 0, 1}).unsqueeze(0);
  return F::interpolate(chw, F::InterpolateFuncOptions()
                                 .size(std::vector<int64_t>{height, width})
                                 .mode(torch::kArea))
      .squeeze(0)
      .permute({1, 2, 0})
      .contiguous();
}

}  // namespace tessera::models::gaussians
