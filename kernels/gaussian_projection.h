// project_gaussians: 3D Gaussians to 2D screen-space ellipses for one pinhole camera (EWA
// splatting, the local-affine projection of INRIA 3DGS and gsplat), with culling and radii.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::kernels {

// Defaults of project_gaussians.
constexpr double kDefaultNearPlane = 0.01;
constexpr double kDefaultFarPlane = 1e10;
// Added to both diagonal entries of the 2D covariance (pixels^2), as INRIA 3DGS and gsplat do:
// every splat covers at least about one pixel, which anti-aliases sub-pixel Gaussians.
constexpr double kDefaultEps2d = 0.3;

// Per Gaussian i, with W, t the rotation rows and translation of viewmat (its last row is not
// read; it is taken to be [0, 0, 0, 1]):
//   p = W mean + t = (x, y, z)                      camera space (OpenCV: x right, y down, z fwd)
//   q = quat / |quat|;  R = R(q) for q = (w, x, y, z);  Sigma = R diag(s) diag(s) R^T
//   ux = clamp(x/z, -lim_x, lim_x), lim_x = 1.3 * tan_fovx, tan_fovx = 0.5 * width / fx
//   uy = clamp(y/z, -lim_y, lim_y), lim_y = 1.3 * tan_fovy, tan_fovy = 0.5 * height / fy
//   J = [[fx/z, 0, -fx*ux/z], [0, fy/z, -fy*uy/z]]   (local-affine Jacobian)
//   cov2d = J W Sigma W^T J^T + eps2d * I = [[a, b], [b, c]],   det = a c - b^2
//   means2d = (fx * x/z + cx, fy * y/z + cy)  (pixels; pixel (row i, col j) centre is (j+.5, i+.5))
//   depths = z;   conics = (c, -b, a) / det  (the inverse [[A, B], [B, C]] as (A, B, C))
//   radius = ceil(3 * sqrt(lambda_max)),  lambda_max = (a + c)/2 + sqrt(((a - c)/2)^2 + b^2)
// Culled (radius 0, all other outputs 0, zero gradient), tested in this order:
//   z < near_plane or z > far_plane;  det <= 0;  the bounding circle entirely off the image:
//   u + r <= 0 or u - r >= width or v + r <= 0 or v - r >= height (r the integer radius).
struct ProjectionOutput {
  at::Tensor radii;    // [N]    int32, 0 = culled; not differentiable
  at::Tensor means2d;  // [N, 2] pixel coordinates (u, v)
  at::Tensor depths;   // [N]    camera-space z
  at::Tensor conics;   // [N, 3] (A, B, C) of the inverse blurred 2D covariance [[A, B], [B, C]]
};

// The differentiable op. Dispatches to the CPU or the CUDA implementation by the inputs' device.
//   means, quats, scales, viewmat: one floating dtype (float32 or float64), one device, any
//   strides. quats must be non-zero (they are normalized inside; the gradient flows through the
//   normalization); scales are already activated (> 0).
//   fx, fy > 0; width, height > 0; 0 < near_plane < far_plane; eps2d >= 0.
// Gradients flow to means, quats and scales from means2d, depths and conics. viewmat and the
// intrinsics get no gradient: passing viewmat with requires_grad (in grad mode) is an error.
ProjectionOutput project_gaussians(
    const at::Tensor& means,    // [N, 3] world-space centres
    const at::Tensor& quats,    // [N, 4] rotations (w, x, y, z), not necessarily unit
    const at::Tensor& scales,   // [N, 3] standard deviations along the rotated axes, > 0
    const at::Tensor& viewmat,  // [4, 4] world -> camera (OpenCV)
    double fx, double fy, double cx, double cy, int64_t width, int64_t height,
    double near_plane = kDefaultNearPlane, double far_plane = kDefaultFarPlane,
    double eps2d = kDefaultEps2d);

// The intrinsics and clipping values of one call, passed along unchanged to the implementations.
struct ProjectionCamera {
  double fx = 0, fy = 0, cx = 0, cy = 0;
  int64_t width = 0, height = 0;
  double near_plane = kDefaultNearPlane, far_plane = kDefaultFarPlane, eps2d = kDefaultEps2d;
};

// Gradients of the backward pass.
struct ProjectionGrads {
  at::Tensor v_means;   // [N, 3]
  at::Tensor v_quats;   // [N, 4]
  at::Tensor v_scales;  // [N, 3]
};

// The two implementations take the same arguments and return the same tensors. They expect
// inputs validated by project_gaussians (shapes, one float dtype, one device) and accept any
// strides. Arithmetic is in the inputs' dtype. In backward, an undefined grad output counts as
// zero, and Gaussians with radii == 0 get zero gradient. The CPU backward is deterministic: each
// Gaussian's gradient is computed by one thread, without atomics.
namespace cpu {
ProjectionOutput project_gaussians_fwd(
    // forward inputs
    const at::Tensor& means,    // [N, 3]
    const at::Tensor& quats,    // [N, 4]
    const at::Tensor& scales,   // [N, 3]
    const at::Tensor& viewmat,  // [4, 4]
    const ProjectionCamera& camera);

ProjectionGrads project_gaussians_bwd(
    // forward inputs
    const at::Tensor& means,      // [N, 3]
    const at::Tensor& quats,      // [N, 4]
    const at::Tensor& scales,     // [N, 3]
    const at::Tensor& viewmat,    // [4, 4]
    const ProjectionCamera& camera,
    // forward outputs
    const at::Tensor& radii,      // [N] int32
    // grad outputs (each may be undefined)
    const at::Tensor& v_means2d,  // [N, 2]
    const at::Tensor& v_depths,   // [N]
    const at::Tensor& v_conics);  // [N, 3]
}  // namespace cpu

namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA). One thread per Gaussian; the current
// stream.
ProjectionOutput project_gaussians_fwd(
    // forward inputs
    const at::Tensor& means,    // [N, 3]
    const at::Tensor& quats,    // [N, 4]
    const at::Tensor& scales,   // [N, 3]
    const at::Tensor& viewmat,  // [4, 4]
    const ProjectionCamera& camera);

ProjectionGrads project_gaussians_bwd(
    // forward inputs
    const at::Tensor& means,      // [N, 3]
    const at::Tensor& quats,      // [N, 4]
    const at::Tensor& scales,     // [N, 3]
    const at::Tensor& viewmat,    // [4, 4]
    const ProjectionCamera& camera,
    // forward outputs
    const at::Tensor& radii,      // [N] int32
    // grad outputs (each may be undefined)
    const at::Tensor& v_means2d,  // [N, 2]
    const at::Tensor& v_depths,   // [N]
    const at::Tensor& v_conics);  // [N, 3]
}  // namespace cuda

}  // namespace tessera::kernels
