// Geometry shared by the importers: pose conventions (OpenGL <-> OpenCV, COLMAP world-to-camera),
// interval splits, and the scene bounds and near/far derived from points or camera centers.
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "framework/data/import.h"

namespace tessera::data {

namespace {

constexpr double kPercentileLow = 0.01;   // SfM clouds carry stray points far from the scene
constexpr double kPercentileHigh = 0.99;
constexpr double kBoundsMargin = 0.10;    // each side pushed out by 10% of the extent
constexpr double kSingleCameraPad = 1.0;  // world units around a lone camera (no extent to scale)
constexpr double kMinNearFraction = 0.01;  // near >= far / 100 keeps depth sampling well posed
// Normalized captures: the cameras sit at this median distance from the center, so that the
// foreground box [-1, 1]^3 holds what they look at. instant-ngp's colmap2nerf puts cameras at a
// mean distance 4 and its scale 0.33 maps [-1.5, 1.5]^3 to the unit cube: 4 / 1.5 ~ 2.6 cube
// half-widths, which is also the NeRF-synthetic ratio (cameras at 4, bounds 1.5).
constexpr double kCanonicalCameraDistance = 2.6;
// The extent of an unbounded capture without instant-ngp's aabb_scale: 16 foreground half-widths,
// instant-ngp's customary aabb_scale for large real scenes. Walls and far backgrounds beyond it
// land on its boundary, which a contracted radiance-field grid resolves only coarsely anyway.
constexpr double kUnboundedExtent = 16.0;
// Axes that converge: the smallest eigenvalue of sum(I - d d^T) / n above this (about the
// 1 - cos^2 of a 13 degree spread) marks an object capture; parallel axes (forward-facing) fall
// back to the SfM points' median, or without points to the mean camera center.
constexpr double kMinAxisSpread = 0.05;
// Near plane of an unbounded capture as a fraction of the camera distance: close enough for
// anything in front of the lens that matters, far enough to keep the first steps meaningful.
constexpr double kUnboundedNearFraction = 0.02;
// Points that set the extent: the 99th percentile of |p|_inf, so stray SfM points do not.
constexpr double kExtentPointPercentile = 0.99;

// The camera center: the translation column of camera_to_world.
std::array<double, 3> center_of(const Camera& camera) {
  const auto& m = camera.camera_to_world;
  return {m[3], m[7], m[11]};
}

// Whether `point` lies ahead of the cameras on average: the sum of its depths along their
// optical axes (OpenCV: +z looks) is positive.
bool ahead_of_cameras(const std::vector<Camera>& cameras, const std::array<double, 3>& point) {
  double depth = 0;
  for (const Camera& camera : cameras) {
    const auto& m = camera.camera_to_world;
    depth += (point[0] - m[3]) * m[2] + (point[1] - m[7]) * m[6] + (point[2] - m[11]) * m[10];
  }
  return depth > 0;
}

}  // namespace

const char* to_string(SourceFormat format) {
  switch (format) {
    case SourceFormat::Blender: return "blender";
    case SourceFormat::Transforms: return "transforms";
    case SourceFormat::Colmap: return "colmap";
  }
  return "unknown";
}

Matrix4 opengl_to_opencv(const Matrix4& camera_to_world) {
  Matrix4 out = camera_to_world;
  for (int row = 0; row < 4; ++row) {  // negate the camera's y and z axes (columns 1 and 2)
    out[row * 4 + 1] = -out[row * 4 + 1];
    out[row * 4 + 2] = -out[row * 4 + 2];
  }
  return out;
}

Matrix4 opencv_to_opengl(const Matrix4& camera_to_world) { return opengl_to_opencv(camera_to_world); }

Matrix4 colmap_to_camera_to_world(const std::array<double, 4>& qvec,
                                  const std::array<double, 3>& tvec) {
  const double norm = std::sqrt(qvec[0] * qvec[0] + qvec[1] * qvec[1] + qvec[2] * qvec[2] +
                                qvec[3] * qvec[3]);
  if (!std::isfinite(norm) || norm == 0.0)
    throw std::invalid_argument("the quaternion is zero or not finite");
  const double w = qvec[0] / norm, x = qvec[1] / norm, y = qvec[2] / norm, z = qvec[3] / norm;
  // World-to-camera rotation of the unit quaternion (COLMAP's Eigen convention, Hamilton).
  const double r[9] = {1 - 2 * (y * y + z * z), 2 * (x * y - w * z),     2 * (x * z + w * y),
                       2 * (x * y + w * z),     1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                       2 * (x * z - w * y),     2 * (y * z + w * x),     1 - 2 * (x * x + y * y)};
  Matrix4 out{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  for (int i = 0; i < 3; ++i) {
    double t = 0;
    for (int j = 0; j < 3; ++j) {
      out[i * 4 + j] = r[j * 3 + i];  // R^T
      t -= r[j * 3 + i] * tvec[j];    // -R^T t
    }
    out[i * 4 + 3] = t;
  }
  for (double v : tvec)
    if (!std::isfinite(v)) throw std::invalid_argument("the translation is not finite");
  return out;
}

void assign_interval_splits(std::vector<Camera>& cameras, int split_every) {
  if (split_every < 2) throw std::invalid_argument("split_every must be >= 2");
  for (size_t i = 0; i < cameras.size(); ++i)  // a lone camera stays in train
    cameras[i].split = i % static_cast<size_t>(split_every) == 0 && cameras.size() > 1
                           ? Split::Val
                           : Split::Train;
}

std::array<double, 6> bounds_from_points(const torch::Tensor& xyz) {
  const torch::Tensor points = xyz.to(torch::kFloat64).contiguous();
  const int64_t count = points.size(0);
  if (count == 0) throw std::invalid_argument("bounds_from_points: no points");
  const double* data = points.data_ptr<double>();
  std::array<double, 6> bounds{};
  std::vector<double> axis(static_cast<size_t>(count));
  for (int a = 0; a < 3; ++a) {
    for (int64_t i = 0; i < count; ++i) axis[static_cast<size_t>(i)] = data[i * 3 + a];
    const auto pick = [&](double q) {
      const auto k = static_cast<size_t>(std::llround(q * static_cast<double>(count - 1)));
      std::nth_element(axis.begin(), axis.begin() + static_cast<std::ptrdiff_t>(k), axis.end());
      return axis[k];
    };
    const double low = pick(kPercentileLow), high = pick(kPercentileHigh);
    const double margin = kBoundsMargin * (high - low);
    bounds[a] = low - margin;
    bounds[a + 3] = high + margin;
  }
  return bounds;
}

std::array<double, 6> bounds_from_cameras(const std::vector<Camera>& cameras) {
  if (cameras.empty()) throw std::invalid_argument("bounds_from_cameras: no cameras");
  std::array<double, 6> bounds{};
  for (int a = 0; a < 3; ++a) {
    bounds[a] = std::numeric_limits<double>::infinity();
    bounds[a + 3] = -std::numeric_limits<double>::infinity();
  }
  for (const Camera& camera : cameras) {
    const auto c = center_of(camera);
    for (int a = 0; a < 3; ++a) {
      bounds[a] = std::min(bounds[a], c[a]);
      bounds[a + 3] = std::max(bounds[a + 3], c[a]);
    }
  }
  double extent = 0;
  for (int a = 0; a < 3; ++a) extent = std::max(extent, bounds[a + 3] - bounds[a]);
  const double margin = extent > 0 ? kBoundsMargin * extent : kSingleCameraPad;
  for (int a = 0; a < 3; ++a) {
    bounds[a] -= margin;
    bounds[a + 3] += margin;
  }
  return bounds;
}

Normalization normalization_for(
    const std::vector<Camera>& cameras, const torch::Tensor& points_xyz,
    const std::optional<NgpBox>& ngp, bool bounded, bool normalize,
    const std::optional<std::pair<double, std::array<double, 3>>>& recorded) {
  if (cameras.empty()) throw std::invalid_argument("normalization_for: no cameras");
  Normalization n;
  double extent_half = 1.0;
  if (recorded) {
    n.scale = recorded->first;
    n.offset = recorded->second;
    extent_half = kUnboundedExtent;
  } else if (ngp) {
    // x * scale + offset in [0, 1]  <=>  2 scale x + 2 (offset - 0.5) in [-1, 1].
    n.scale = 2.0 * ngp->scale;
    for (int a = 0; a < 3; ++a) n.offset[a] = 2.0 * (ngp->offset[a] - 0.5);
    extent_half = std::max(1.0, ngp->aabb_scale);
  } else {
    // The point nearest to every optical axis (least squares): sum (I - d d^T) c = sum (I - d d^T) o.
    const size_t count = cameras.size();
    double a[9] = {0}, b[3] = {0}, mean[3] = {0};
    for (const Camera& camera : cameras) {
      const auto& m = camera.camera_to_world;
      const double o[3] = {m[3], m[7], m[11]}, d[3] = {m[2], m[6], m[10]};  // OpenCV: +z looks
      for (int i = 0; i < 3; ++i) {
        mean[i] += o[i] / static_cast<double>(count);
        for (int j = 0; j < 3; ++j) {
          const double q = (i == j ? 1.0 : 0.0) - d[i] * d[j];
          a[i * 3 + j] += q;
          b[i] += q * o[j];
        }
      }
    }
    const torch::Tensor am = torch::from_blob(a, {3, 3}, torch::kFloat64).clone();
    const double spread =
        torch::linalg_eigvalsh(am).min().item<double>() / static_cast<double>(count);
    double center[3] = {mean[0], mean[1], mean[2]};
    bool converged = false;
    if (spread > kMinAxisSpread) {
      const torch::Tensor focus =
          torch::linalg_solve(am, torch::from_blob(b, {3, 1}, torch::kFloat64).clone(), true);
      const std::array<double, 3> point = {focus[0][0].item<double>(), focus[1][0].item<double>(),
                                           focus[2][0].item<double>()};
      if (ahead_of_cameras(cameras, point)) {  // the focus must lie ahead of the cameras
        for (int i = 0; i < 3; ++i) center[i] = point[i];
        converged = true;
      }
    }
    if (!converged && points_xyz.defined() && points_xyz.size(0) > 0) {
      // Forward-facing: what the cameras look at is where their SfM points are, not where the
      // cameras stand. Around the cameras' own center, a short baseline against a deep scene
      // (LLFF's fern: the content ~20 baselines out) would put all of it far outside the
      // foreground box, in contracted space. The points' median (per axis, robust to stray
      // points and to the far background), when it lies ahead of the cameras on average.
      const torch::Tensor median = std::get<0>(points_xyz.to(torch::kFloat64).median(0));
      const std::array<double, 3> point = {median[0].item<double>(), median[1].item<double>(),
                                           median[2].item<double>()};
      if (ahead_of_cameras(cameras, point))
        for (int i = 0; i < 3; ++i) center[i] = point[i];
    }
    std::vector<double> distances;
    for (const Camera& camera : cameras) {
      const auto c = center_of(camera);
      distances.push_back(std::sqrt((c[0] - center[0]) * (c[0] - center[0]) +
                                    (c[1] - center[1]) * (c[1] - center[1]) +
                                    (c[2] - center[2]) * (c[2] - center[2])));
    }
    std::nth_element(distances.begin(), distances.begin() + distances.size() / 2, distances.end());
    const double median = distances[distances.size() / 2];
    n.scale = median > 0 ? kCanonicalCameraDistance / median : 1.0;
    for (int i = 0; i < 3; ++i) n.offset[i] = -n.scale * center[i];
    extent_half = kUnboundedExtent;
  }
  // Everything the cameras see must fit: the cameras themselves and the bulk of the points.
  double reach = 0;
  for (const Camera& camera : cameras) {
    const auto c = center_of(camera);
    for (int i = 0; i < 3; ++i) reach = std::max(reach, std::abs(n.scale * c[i] + n.offset[i]));
  }
  if (points_xyz.defined() && points_xyz.size(0) > 0) {
    const torch::Tensor p = points_xyz.to(torch::kFloat64) * n.scale +
                            torch::tensor({n.offset[0], n.offset[1], n.offset[2]}, torch::kFloat64);
    const torch::Tensor norm = std::get<0>(p.abs().max(1));
    reach = std::max(reach, torch::quantile(norm, kExtentPointPercentile).item<double>());
  }
  if (!ngp || recorded) extent_half = bounded ? 1.0 : std::max(extent_half, (1.0 + kBoundsMargin) * reach);
  n.bounds = {-1, -1, -1, 1, 1, 1};
  n.extent = {-extent_half, -extent_half, -extent_half, extent_half, extent_half, extent_half};

  std::vector<Camera> world = cameras;
  torch::Tensor no_points;
  apply_normalization(n, world, no_points);
  const auto [near, far] = near_far_from_bounds(n.extent, world);
  n.near = near;
  n.far = far;
  if (n.extent != n.bounds) {  // unbounded: the near plane follows the cameras, not the extent
    double distance = 0;
    for (const Camera& camera : world) {
      const auto c = center_of(camera);
      distance += std::sqrt(c[0] * c[0] + c[1] * c[1] + c[2] * c[2]) / static_cast<double>(world.size());
    }
    n.near = std::max(kUnboundedNearFraction * distance, 1e-6 * far);
  }
  if (!normalize) {  // the same boxes, in the capture's own coordinates
    const double inv = 1.0 / n.scale;
    for (int i = 0; i < 6; ++i) {
      n.bounds[i] = (n.bounds[i] - n.offset[i % 3]) * inv;
      n.extent[i] = (n.extent[i] - n.offset[i % 3]) * inv;
    }
    n.near *= inv;
    n.far *= inv;
    n.scale = 1.0;
    n.offset = {0, 0, 0};
  }
  return n;
}

void apply_normalization(const Normalization& n, std::vector<Camera>& cameras,
                         torch::Tensor& points_xyz) {
  for (Camera& camera : cameras) {
    auto& m = camera.camera_to_world;
    for (int i = 0; i < 3; ++i) m[i * 4 + 3] = n.scale * m[i * 4 + 3] + n.offset[i];
  }
  if (points_xyz.defined() && points_xyz.size(0) > 0) {
    const torch::Tensor p = points_xyz.to(torch::kFloat64) * n.scale +
                            torch::tensor({n.offset[0], n.offset[1], n.offset[2]}, torch::kFloat64);
    points_xyz = p.to(torch::kFloat32).contiguous();
  }
}

void record_normalization(const Normalization& n, SceneMeta& meta) {
  meta.scene_bounds = n.bounds;
  meta.scene_extent = n.extent;
  meta.capture_scale = n.scale;
  meta.capture_offset = n.offset;
  meta.near = n.near;
  meta.far = n.far;
}

std::pair<double, double> near_far_from_bounds(const std::array<double, 6>& bounds,
                                               const std::vector<Camera>& cameras) {
  double near = std::numeric_limits<double>::infinity(), far = 0;
  for (const Camera& camera : cameras) {
    const auto c = center_of(camera);
    double inside2 = 0, corner2 = 0;  // squared distance to the box, to its farthest corner
    for (int a = 0; a < 3; ++a) {
      const double below = bounds[a] - c[a], above = c[a] - bounds[a + 3];
      const double gap = std::max({below, above, 0.0});
      inside2 += gap * gap;
      const double reach = std::max(std::abs(c[a] - bounds[a]), std::abs(c[a] - bounds[a + 3]));
      corner2 += reach * reach;
    }
    near = std::min(near, std::sqrt(inside2));
    far = std::max(far, std::sqrt(corner2));
  }
  return {std::max(near, kMinNearFraction * far), far};
}

}  // namespace tessera::data
