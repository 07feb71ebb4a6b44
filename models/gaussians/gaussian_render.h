// Renders one camera view of a GaussianParams: projection, SH colours, tile binning and
// rasterization (kernels/), returning the image and what densification needs.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>

#include "framework/data/scene.h"
#include "kernels/gaussian_projection.h"
#include "kernels/tile_binning.h"
#include "models/gaussians/gaussian_params.h"

namespace tessera::models::gaussians {

// A pinhole camera as the kernels take it.
struct RenderCamera {
  torch::Tensor viewmat;            // [4, 4] float32, world -> camera (OpenCV)
  std::array<double, 3> centre{};   // camera centre in world space
  double fx = 0, fy = 0, cx = 0, cy = 0;
  int64_t width = 0, height = 0;
};

// viewmat = inverse(camera_to_world) (rigid inverse, in float64, then float32). `downscale` >= 1
// renders at width = round(W / downscale), height = round(H / downscale) with the intrinsics
// scaled by the same per-axis ratios (new_width / W, new_height / H). Distortion is ignored.
RenderCamera make_render_camera(const data::Camera& camera, double downscale = 1.0,
                                torch::Device device = torch::kCPU);

struct RenderOptions {
  int sh_degree = kMaxShDegree;  // active SH degree, 0..3
  torch::Tensor background;      // [3] float32, or undefined for black
  torch::Tensor tile_mask;       // [T] bool: render only these tiles (others get the background)
  int64_t tile_size = kernels::kDefaultTileSize;
  double near_plane = kernels::kDefaultNearPlane;
  double far_plane = kernels::kDefaultFarPlane;
  double eps2d = kernels::kDefaultEps2d;
};

struct RenderOutput {
  torch::Tensor image;    // [H, W, 3] composited over the background
  torch::Tensor alphas;   // [H, W]    accumulated opacity
  torch::Tensor radii;    // [N] int32 screen radius in pixels, 0 = not visible
  torch::Tensor means2d;  // [N, 2] pixel centres; when the params require grad (grad mode on),
                          // retain_grad() has been called: after backward, means2d.grad() is
                          // the per-view screen-space gradient v_means2d for densification
  torch::Tensor depths;   // [N]
  int64_t width = 0, height = 0;
};

// Differentiable with respect to every tensor of `params` (SH colours use
// dirs = means - camera centre, so means also get the view-dependence gradient, as INRIA).
RenderOutput render_gaussians(const GaussianParams& params, const RenderCamera& camera,
                              const RenderOptions& options = {});

// Area-averaged resize of an image [H, W, C] (e.g. a target at a resolution scale) to
// [height, width, C]; float in, float out.
torch::Tensor resize_image(const torch::Tensor& image, int64_t width, int64_t height);

}  // namespace tessera::models::gaussians
