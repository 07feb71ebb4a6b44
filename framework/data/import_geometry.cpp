// Geometry shared by the importers: pose conventions (OpenGL <-> OpenCV, COLMAP world-to-camera),
// interval splits, and the scene bounds and near/far derived from points or camera centers.
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

// The camera center: the translation column of camera_to_world.
std::array<double, 3> center_of(const Camera& camera) {
  const auto& m = camera.camera_to_world;
  return {m[3], m[7], m[11]};
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
