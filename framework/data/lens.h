// The OpenCV lens model (k1, k2, p1, p2 of data::Camera) in one place, in double precision:
// distortion of normalized coordinates, its Newton inverse, and undistortion of whole images.
#pragma once

#include <torch/types.h>

#include <string>

#include "framework/data/scene.h"

namespace tessera::data {

// undistort() stops once |distort(x, y) - (xd, yd)| (max norm, normalized units) is at most
// this: 1e-12 of a focal length is ~1e-9 pixels even at 8192 pixels across, and still ~1e4 times
// the rounding error of double arithmetic on coordinates of order 1.
constexpr double kUndistortTolerance = 1e-12;
// Newton converges quadratically from x = xd for real lenses (at most 3 iterations for the
// instant-ngp fox over a 50 degree view, 4 for a strong barrel k1 = -0.3); 20 is a cap, reached
// only where no inverse exists (see undistort).
constexpr int kUndistortMaxIterations = 20;

// Whether any of k1, k2, p1, p2 is nonzero. Without distortion every function below is the
// identity and callers keep their exact pinhole paths.
bool has_distortion(const Camera& camera);

// OpenCV's forward model on normalized coordinates (x, y) = (X / Z, Y / Z) of a camera-space
// point: r2 = x^2 + y^2, radial = 1 + k1 r2 + k2 r2^2,
//   xd = x radial + 2 p1 x y + p2 (r2 + 2 x^2),   yd = y radial + p1 (r2 + 2 y^2) + 2 p2 x y.
// The pixel is then (fx xd + cx, fy yd + cy).
void distort(const Camera& camera, double x, double y, double* xd, double* yd);

// The inverse of distort(): Newton's method with the exact 2x2 Jacobian, started at (x, y) =
// (xd, yd), stopped at residual kUndistortTolerance or after kUndistortMaxIterations.
// Convergence domain: distort() is invertible on the connected region around the optical axis
// where its Jacobian determinant stays positive (for radial-only lenses, the disc of radii where
// d/dr [r (1 + k1 r^2 + k2 r^4)] > 0; e.g. k1 = -0.3, k2 = 0 folds at r = 1.05). For distorted
// points inside the image of that region, Newton converges to the unique preimage there; the
// whole image of a usable camera lies inside it, which distortion_problem() checks. Beyond the
// fold there is no inverse (or only one on the far side of the fold) and the result is the last
// iterate. With no distortion the result is (xd, yd) exactly.
void undistort(const Camera& camera, double xd, double yd, double* x, double* y);

// "" when undistort() converges, onto the unfolded region around the optical axis (Jacobian
// determinant > 0 on the segment from the axis to the solution), at every point of the camera's
// image: the whole border at pixel spacing (where a fold shows first) and an interior grid.
// Otherwise says where and why it fails. Coefficients that are not finite fail too.
std::string distortion_problem(const Camera& camera);

// The largest |(x, y)| of the undistorted normalized coordinates over the image rectangle
// [0, width] x [0, height]: the tangent of the widest angle between a pixel's ray and the optical
// axis. Undistortion maps the image boundary to the boundary of its preimage, so the border (at
// half-pixel spacing) is searched. Requires distortion_problem(camera) == "".
double max_ray_tangent(const Camera& camera);

// The pinhole image (same fx, fy, cx, cy and size, no distortion) of an image taken through the
// camera's lens. Output pixel (u, v) has center (u + 0.5, v + 0.5); it is moved to normalized
// coordinates, distorted, moved back to pixel coordinates, and bilinearly sampled with source
// pixel centers at +0.5, clamped to the edge outside the image. Rows in parallel.
// image: float32 [H, W, C] (any C) with H, W the camera's size; returns float32 [H, W, C]
// (`image` itself when !has_distortion(camera)).
torch::Tensor undistort_image(const torch::Tensor& image, const Camera& camera);

}  // namespace tessera::data
