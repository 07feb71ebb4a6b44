// Test fixtures shared by the import and normalization tests: small 3D vector helpers, OpenGL
// look-at poses, the OpenCV projection a dataset promises, pose JSON and a temporary folder.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/data/import.h"
#include "tests/test_util.h"

namespace tessera::test {

using Vec3 = std::array<double, 3>;

inline Vec3 sub(const Vec3& a, const Vec3& b) { return {a[0] - b[0], a[1] - b[1], a[2] - b[2]}; }
inline Vec3 cross(const Vec3& a, const Vec3& b) {
  return {a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]};
}
inline Vec3 normalize(const Vec3& a) {
  const double n = std::sqrt(a[0] * a[0] + a[1] * a[1] + a[2] * a[2]);
  return {a[0] / n, a[1] / n, a[2] / n};
}

// OpenGL camera-to-world looking from `eye` at `target` (camera -z forward, `up` roughly up).
inline data::Matrix4 look_at_gl(const Vec3& eye, const Vec3& target, const Vec3& up = {0, 1, 0}) {
  const Vec3 z = normalize(sub(eye, target)), x = normalize(cross(up, z)), y = cross(z, x);
  return {x[0], y[0], z[0], eye[0], x[1], y[1], z[1], eye[1], x[2], y[2], z[2], eye[2], 0, 0, 0, 1};
}

struct Pixel {
  double u, v, depth;
};

// The OpenCV projection the dataset promises: x_cam = R^T (X - t), u = fx x/z + cx, v = fy y/z + cy.
inline Pixel project(const data::Camera& c, const Vec3& X) {
  const auto& m = c.camera_to_world;
  const Vec3 d = {X[0] - m[3], X[1] - m[7], X[2] - m[11]};
  double p[3];
  for (int j = 0; j < 3; ++j) p[j] = m[j] * d[0] + m[4 + j] * d[1] + m[8 + j] * d[2];
  return {c.fx * p[0] / p[2] + c.cx, c.fy * p[1] / p[2] + c.cy, p[2]};
}

// A row-major 4x4 as transforms.json's nested rows.
inline nlohmann::json matrix_json(const data::Matrix4& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (int r = 0; r < 4; ++r) rows.push_back({m[r * 4], m[r * 4 + 1], m[r * 4 + 2], m[r * 4 + 3]});
  return rows;
}

// A fresh folder under GoogleTest's temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tessera_import") {
    std::string pattern =
        (std::filesystem::path(testing::TempDir()) / (prefix + "_XXXXXX")).string();
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (!mkdtemp(buffer.data())) throw std::runtime_error("mkdtemp failed");
    path_ = buffer.data();
  }
  ~TempDir() { remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tessera::test
