// Checks shared by the tessera-scene writer and reader: one camera, the root attributes, split
// names and the per-image dataset names (SceneWriter and SceneReader live beside this file).
#include <cmath>
#include <cstdio>
#include <sstream>

#include "distributed/errors.h"
#include "framework/data/scene.h"
#include "framework/data/scene_layout.h"

namespace tessera::data {

namespace {

// |R^T R - I| per element above this means the rotation is not orthonormal. Loose enough for
// poses that went through float32 (importers, transforms.json), tight enough to catch a scaled
// or sheared matrix.
constexpr double kOrthonormalTolerance = 1e-3;
// The last row of camera_to_world must be (0, 0, 0, 1) within this (exact in practice).
constexpr double kLastRowTolerance = 1e-6;

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

[[noreturn]] void camera_error(const std::string& origin, size_t index, const std::string& what) {
  throw UserError(origin + ": camera " + std::to_string(index) + ": " + what);
}

}  // namespace

bool SceneMeta::unbounded() const {
  for (int axis = 0; axis < 3; ++axis)
    if (scene_extent[axis] < scene_bounds[axis] || scene_extent[axis + 3] > scene_bounds[axis + 3])
      return true;
  return false;
}

const char* to_string(Split split) {
  switch (split) {
    case Split::Train: return "train";
    case Split::Val: return "val";
    case Split::Test: return "test";
  }
  return "unknown";
}

Split parse_split(const std::string& name, const std::string& what) {
  for (Split split : {Split::Train, Split::Val, Split::Test})
    if (name == to_string(split)) return split;
  throw UserError(what + " must be train, val or test (got \"" + name + "\")");
}

void validate_camera(const Camera& camera, size_t index, const std::string& origin) {
  const std::pair<const char*, double> scalars[] = {
      {"fx", camera.fx}, {"fy", camera.fy}, {"cx", camera.cx}, {"cy", camera.cy},
      {"k1", camera.k1}, {"k2", camera.k2}, {"p1", camera.p1}, {"p2", camera.p2}};
  for (const auto& [name, value] : scalars)
    if (!std::isfinite(value)) camera_error(origin, index, std::string(name) + " is " + number(value));
  if (camera.fx <= 0 || camera.fy <= 0)
    camera_error(origin, index, "focal length fx = " + number(camera.fx) + ", fy = " +
                                    number(camera.fy) + " (both must be > 0 pixels)");
  if (camera.width <= 0 || camera.height <= 0)
    camera_error(origin, index, "size " + std::to_string(camera.width) + "x" +
                                    std::to_string(camera.height) +
                                    " (width and height must be > 0)");
  const auto& m = camera.camera_to_world;
  for (int i = 0; i < 16; ++i)
    if (!std::isfinite(m[i]))
      camera_error(origin, index, "camera_to_world[" + std::to_string(i / 4) + "][" +
                                      std::to_string(i % 4) + "] is " + number(m[i]));
  if (std::abs(m[12]) > kLastRowTolerance || std::abs(m[13]) > kLastRowTolerance ||
      std::abs(m[14]) > kLastRowTolerance || std::abs(m[15] - 1) > kLastRowTolerance)
    camera_error(origin, index, "last row of camera_to_world is (" + number(m[12]) + ", " +
                                    number(m[13]) + ", " + number(m[14]) + ", " + number(m[15]) +
                                    "), must be (0, 0, 0, 1)");
  double worst = 0;  // max |R^T R - I|
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      double dot = 0;
      for (int r = 0; r < 3; ++r) dot += m[r * 4 + a] * m[r * 4 + b];
      worst = std::max(worst, std::abs(dot - (a == b ? 1.0 : 0.0)));
    }
  if (worst > kOrthonormalTolerance)
    camera_error(origin, index, "the rotation of camera_to_world is not orthonormal (max |R^T R - "
                                "I| = " + number(worst) + ", tolerance " +
                                    number(kOrthonormalTolerance) + ")");
  const double det = m[0] * (m[5] * m[10] - m[6] * m[9]) - m[1] * (m[4] * m[10] - m[6] * m[8]) +
                     m[2] * (m[4] * m[9] - m[5] * m[8]);
  if (det < 0)
    camera_error(origin, index, "the rotation of camera_to_world is a reflection (det = " +
                                    number(det) + "); a flipped axis? (OpenCV: x right, y down, "
                                    "z forward)");
  const auto split = static_cast<unsigned>(camera.split);
  if (split > static_cast<unsigned>(Split::Test))
    camera_error(origin, index, "split " + std::to_string(split) +
                                    " is not 0 (train), 1 (val) or 2 (test)");
}

namespace layout {

std::string image_name(size_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "%0*zu", kImageNameDigits, index);
  return name;
}

void validate_meta(const SceneMeta& meta, const std::string& origin) {
  auto fail = [&](const std::string& what) { throw UserError(origin + ": " + what); };
  for (double v : meta.scene_bounds)
    if (!std::isfinite(v)) fail("scene_bounds has a non-finite value (" + number(v) + ")");
  for (int axis = 0; axis < 3; ++axis)
    if (meta.scene_bounds[axis] > meta.scene_bounds[axis + 3])
      fail(std::string("scene_bounds ") + "xyz"[axis] + " minimum " +
           number(meta.scene_bounds[axis]) + " is above its maximum " +
           number(meta.scene_bounds[axis + 3]) + " (order: xmin, ymin, zmin, xmax, ymax, zmax)");
  if (!std::isfinite(meta.near) || !std::isfinite(meta.far) || meta.near < 0 ||
      meta.far <= meta.near)
    fail("near = " + number(meta.near) + ", far = " + number(meta.far) + " (" +
         (std::isfinite(meta.near) && std::isfinite(meta.far) ? "" : "non-finite; ") +
         "need 0 <= near < far)");
  for (double v : meta.background)
    if (!(v >= 0 && v <= 1))
      fail("background has " + number(v) + " (each of R, G, B must be in [0, 1])");
  for (double v : meta.scene_extent)
    if (!std::isfinite(v)) fail("scene_extent has a non-finite value (" + number(v) + ")");
  for (int axis = 0; axis < 3; ++axis)
    if (!(meta.scene_extent[axis] <= meta.scene_bounds[axis]) ||
        !(meta.scene_extent[axis + 3] >= meta.scene_bounds[axis + 3]))
      fail(std::string("scene_extent must contain scene_bounds; on ") + "xyz"[axis] + " it is [" +
           number(meta.scene_extent[axis]) + ", " + number(meta.scene_extent[axis + 3]) +
           "] around [" + number(meta.scene_bounds[axis]) + ", " +
           number(meta.scene_bounds[axis + 3]) + "]");
  if (!std::isfinite(meta.capture_scale) || !(meta.capture_scale > 0))
    fail("capture_scale = " + number(meta.capture_scale) + " (need a finite value > 0)");
  for (double v : meta.capture_offset)
    if (!std::isfinite(v)) fail("capture_offset has a non-finite value (" + number(v) + ")");
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace layout
}  // namespace tessera::data
