// The OpenCV lens model (k1, k2, p1, p2): distort, its Newton inverse, the check that a camera's
// whole image can be undistorted, and bilinear undistortion of images for pinhole renderers.
#include "framework/data/lens.h"
#include "kernels/cpu/parallel.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace tessera::data {

namespace {

// Interior points per image side that distortion_problem() checks besides the whole border: a
// fold starts at the border (the largest radii), the grid guards lenses that fold inside.
constexpr int kInteriorGrid = 32;
// Points on the segment from the optical axis to each solution where distortion_problem() checks
// that the Jacobian determinant stays positive: Newton can also land on a preimage beyond a fold
// (k1 = -1 sends points at r ~ 1.25 on the opposite side back into the image), which is no ray of
// that pixel. Lenses fold at one radius, so 16 points find it.
constexpr int kSegmentChecks = 16;
// Rows per at::parallel_for task hold at least this many pixels, so that scheduling costs little
// next to the per-pixel distortion and interpolation.
constexpr int64_t kPixelsPerTask = 4096;

// The Jacobian of distort() at (x, y): j = {dxd/dx, dxd/dy, dyd/dx, dyd/dy}.
void distort_jacobian(const Camera& c, double x, double y, double j[4]) {
  const double r2 = x * x + y * y;
  const double radial = 1.0 + c.k1 * r2 + c.k2 * r2 * r2;
  const double dradial = 2.0 * (c.k1 + 2.0 * c.k2 * r2);  // d radial / dx = x * dradial
  j[0] = radial + x * x * dradial + 2.0 * c.p1 * y + 6.0 * c.p2 * x;
  j[1] = x * y * dradial + 2.0 * c.p1 * x + 2.0 * c.p2 * y;
  j[2] = x * y * dradial + 2.0 * c.p1 * x + 2.0 * c.p2 * y;
  j[3] = radial + y * y * dradial + 6.0 * c.p1 * y + 2.0 * c.p2 * x;
}

// Newton's method for distort(x, y) = (xd, yd) from (xd, yd); returns the final residual (max
// norm; NaN or infinite when the iterates ran away).
double newton_undistort(const Camera& c, double xd, double yd, double* x_out, double* y_out) {
  double x = xd, y = yd, residual = std::numeric_limits<double>::infinity();
  for (int iteration = 0;; ++iteration) {
    double ex, ey;
    distort(c, x, y, &ex, &ey);
    ex -= xd, ey -= yd;
    residual = std::max(std::abs(ex), std::abs(ey));
    if (residual <= kUndistortTolerance || iteration == kUndistortMaxIterations) break;
    double j[4];
    distort_jacobian(c, x, y, j);
    const double det = j[0] * j[3] - j[1] * j[2];
    if (!std::isfinite(det) || det == 0.0) break;  // singular: no Newton step exists
    x -= (j[3] * ex - j[1] * ey) / det;
    y -= (j[0] * ey - j[2] * ex) / det;
  }
  *x_out = x, *y_out = y;
  return residual;
}

// Calls visit(px, py) for image points along the border of [0, width] x [0, height], `step`
// pixels apart (corners included).
template <typename Visit>
void for_each_border_point(const Camera& c, double step, Visit&& visit) {
  const int64_t nu = static_cast<int64_t>(std::ceil(c.width / step));
  const int64_t nv = static_cast<int64_t>(std::ceil(c.height / step));
  for (int64_t i = 0; i <= nu; ++i) {
    const double u = std::min<double>(c.width, i * step);
    visit(u, 0.0);
    visit(u, static_cast<double>(c.height));
  }
  for (int64_t i = 1; i < nv; ++i) {
    const double v = std::min<double>(c.height, i * step);
    visit(0.0, v);
    visit(static_cast<double>(c.width), v);
  }
}

}  // namespace

bool has_distortion(const Camera& camera) {
  return camera.k1 != 0.0 || camera.k2 != 0.0 || camera.p1 != 0.0 || camera.p2 != 0.0;
}

void distort(const Camera& c, double x, double y, double* xd, double* yd) {
  const double r2 = x * x + y * y;
  const double radial = 1.0 + c.k1 * r2 + c.k2 * r2 * r2;
  *xd = x * radial + 2.0 * c.p1 * x * y + c.p2 * (r2 + 2.0 * x * x);
  *yd = y * radial + c.p1 * (r2 + 2.0 * y * y) + 2.0 * c.p2 * x * y;
}

void undistort(const Camera& camera, double xd, double yd, double* x, double* y) {
  if (!has_distortion(camera)) {
    *x = xd, *y = yd;
    return;
  }
  newton_undistort(camera, xd, yd, x, y);
}

std::string distortion_problem(const Camera& camera) {
  const double coefficients[4] = {camera.k1, camera.k2, camera.p1, camera.p2};
  const char* names[4] = {"k1", "k2", "p1", "p2"};
  for (int i = 0; i < 4; ++i)
    if (!std::isfinite(coefficients[i])) return std::string(names[i]) + " is not finite";
  if (!has_distortion(camera)) return "";
  std::string problem;
  auto check = [&](double px, double py) {
    if (!problem.empty()) return;
    const double xd = (px - camera.cx) / camera.fx, yd = (py - camera.cy) / camera.fy;
    double x, y;
    const double residual = newton_undistort(camera, xd, yd, &x, &y);
    double det = 1.0;  // the smallest determinant on the segment from the axis to (x, y)
    for (int i = 1; i <= kSegmentChecks; ++i) {
      const double s = static_cast<double>(i) / kSegmentChecks;
      double j[4];
      distort_jacobian(camera, s * x, s * y, j);
      det = std::min(det, j[0] * j[3] - j[1] * j[2]);
    }
    char text[256];
    if (!(residual <= kUndistortTolerance)) {
      std::snprintf(text, sizeof text,
                    "undistortion does not converge at pixel (%g, %g) of the %dx%d image "
                    "(residual %.3g after %d iterations): the lens model has no inverse there",
                    px, py, camera.width, camera.height, residual, kUndistortMaxIterations);
      problem = text;
    } else if (!(det > 0.0)) {
      std::snprintf(text, sizeof text,
                    "the lens model folds over at pixel (%g, %g) of the %dx%d image (Jacobian "
                    "determinant %.3g between the axis and its ray): pixels there have no "
                    "unique ray",
                    px, py, camera.width, camera.height, det);
      problem = text;
    }
  };
  for_each_border_point(camera, 1.0, check);
  for (int i = 0; i < kInteriorGrid; ++i)
    for (int k = 0; k < kInteriorGrid; ++k)
      check(camera.width * (k + 0.5) / kInteriorGrid, camera.height * (i + 0.5) / kInteriorGrid);
  return problem;
}

double max_ray_tangent(const Camera& camera) {
  double widest = 0.0;
  for_each_border_point(camera, 0.5, [&](double px, double py) {
    double x, y;
    undistort(camera, (px - camera.cx) / camera.fx, (py - camera.cy) / camera.fy, &x, &y);
    widest = std::max(widest, std::hypot(x, y));
  });
  return widest;
}

torch::Tensor undistort_image(const torch::Tensor& image, const Camera& camera) {
  if (!has_distortion(camera)) return image;
  if (image.dim() != 3 || image.scalar_type() != torch::kFloat32 ||
      image.size(0) != camera.height || image.size(1) != camera.width)
    throw std::invalid_argument("undistort_image: expected a float32 [" +
                                std::to_string(camera.height) + ", " +
                                std::to_string(camera.width) + ", C] image, got " +
                                c10::str(image.scalar_type(), " ", image.sizes()));
  const torch::Tensor src = image.contiguous();  // [H, W, C]
  torch::Tensor out = torch::empty_like(src);    // [H, W, C]
  const int64_t height = src.size(0), width = src.size(1), channels = src.size(2);
  const float* in = src.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, kPixelsPerTask / std::max<int64_t>(1, width));
  tessera::parallel_for(0, height, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t v = row_begin; v < row_end; ++v) {
      for (int64_t u = 0; u < width; ++u) {
        double xd, yd;
        distort(camera, (u + 0.5 - camera.cx) / camera.fx, (v + 0.5 - camera.cy) / camera.fy,
                &xd, &yd);
        // Source position in "pixel index" units (centers on integers), kept within one pixel of
        // the image so that floor() stays representable; clamping to the edge does the rest.
        const double sx = std::clamp(camera.fx * xd + camera.cx - 0.5, -1.0, double(width));
        const double sy = std::clamp(camera.fy * yd + camera.cy - 0.5, -1.0, double(height));
        const double fx0 = std::floor(sx), fy0 = std::floor(sy);
        const double tx = sx - fx0, ty = sy - fy0;
        const int64_t x0 = std::clamp<int64_t>(static_cast<int64_t>(fx0), 0, width - 1);
        const int64_t x1 = std::clamp<int64_t>(static_cast<int64_t>(fx0) + 1, 0, width - 1);
        const int64_t y0 = std::clamp<int64_t>(static_cast<int64_t>(fy0), 0, height - 1);
        const int64_t y1 = std::clamp<int64_t>(static_cast<int64_t>(fy0) + 1, 0, height - 1);
        const float* p00 = in + (y0 * width + x0) * channels;
        const float* p01 = in + (y0 * width + x1) * channels;
        const float* p10 = in + (y1 * width + x0) * channels;
        const float* p11 = in + (y1 * width + x1) * channels;
        float* o = dst + (v * width + u) * channels;
        for (int64_t k = 0; k < channels; ++k) {
          const double top = (1.0 - tx) * p00[k] + tx * p01[k];
          const double bottom = (1.0 - tx) * p10[k] + tx * p11[k];
          o[k] = static_cast<float>((1.0 - ty) * top + ty * bottom);
        }
      }
    }
  });
  return out;
}

}  // namespace tessera::data
