// nerfstudio camera paths (framework/data/camera_path.h).
#include "framework/data/camera_path.h"

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "distributed/errors.h"
#include "framework/data/import.h"

namespace tessera::data {

namespace {

nlohmann::json read_json(const std::string& path, const std::string& what) {
  nlohmann::json j = load_json_file(path);
  if (!j.is_object()) throw UserError(what + " " + path + " is not a JSON object");
  return j;
}

double number(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number() || !std::isfinite(j[key].get<double>()))
    throw UserError(where + ": \"" + key + "\" must be a number");
  return j[key].get<double>();
}

}  // namespace

CameraPath read_camera_path(const std::string& path, const SceneMeta& meta,
                            const std::string& dataparser_transforms) {
  const nlohmann::json j = read_json(path, "camera path");
  if (j.contains("camera_type") && (!j["camera_type"].is_string() ||
                                    j["camera_type"].get<std::string>() != "perspective"))
    throw UserError(path + ": camera_type " + j["camera_type"].dump() +
                    " is not supported; Tessera renders \"perspective\" camera paths");
  const double width = number(j, "render_width", path), height = number(j, "render_height", path);
  if (width < 1 || height < 1 || width != std::floor(width) || height != std::floor(height) ||
      width > 16384 || height > 16384)
    throw UserError(path + ": render_width and render_height must be whole numbers of pixels "
                    "from 1 to 16384");
  if (!j.contains("camera_path") || !j["camera_path"].is_array() || j["camera_path"].empty())
    throw UserError(path + ": \"camera_path\" must be a non-empty list of cameras");

  // nerfstudio's normalization of the run the path was made in: model = s * (T * capture).
  std::array<double, 12> transform{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0};
  double scale = 1.0;
  if (!dataparser_transforms.empty()) {
    const nlohmann::json d = read_json(dataparser_transforms, "dataparser transforms");
    scale = number(d, "scale", dataparser_transforms);
    const auto& t = d.contains("transform") ? d["transform"] : nlohmann::json();
    if (!(scale > 0) || !t.is_array() || t.size() != 3)
      throw UserError(dataparser_transforms + ": needs \"transform\" (3 rows of 4 numbers) and a "
                      "positive \"scale\", as nerfstudio writes dataparser_transforms.json");
    for (size_t r = 0; r < 3; ++r) {
      if (!t[r].is_array() || t[r].size() != 4)
        throw UserError(dataparser_transforms + ": \"transform\" must be 3 rows of 4 numbers");
      for (size_t c = 0; c < 4; ++c) {
        if (!t[r][c].is_number())
          throw UserError(dataparser_transforms + ": \"transform\" must be 3 rows of 4 numbers");
        transform[r * 4 + c] = t[r][c].get<double>();
      }
    }
  }

  CameraPath out;
  if (j.contains("fps") && j["fps"].is_number() && j["fps"].get<double>() > 0)
    out.fps = j["fps"].get<double>();
  for (size_t i = 0; i < j["camera_path"].size(); ++i) {
    const nlohmann::json& entry = j["camera_path"][i];
    const std::string where = path + ": camera_path[" + std::to_string(i) + "]";
    if (!entry.is_object()) throw UserError(where + " is not an object");
    const nlohmann::json& m = entry.contains("camera_to_world") ? entry["camera_to_world"] : nlohmann::json();
    if (!m.is_array() || m.size() != 16)
      throw UserError(where + ": \"camera_to_world\" must be 16 numbers (a row-major 4x4 matrix)");
    Matrix4 gl{};
    for (size_t k = 0; k < 16; ++k) {
      if (!m[k].is_number() || !std::isfinite(m[k].get<double>()))
        throw UserError(where + ": \"camera_to_world\" must be 16 finite numbers");
      gl[k] = m[k].get<double>();
    }
    const double fov = number(entry, "fov", where);
    if (!(fov > 0 && fov < 180)) throw UserError(where + ": \"fov\" must be in (0, 180) degrees");
    // Undo nerfstudio's normalization: R^T (x / s - t) for the position, R^T * rotation.
    Matrix4 capture = gl;
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 3; ++c) {
        double v = 0;
        for (int k = 0; k < 3; ++k) v += transform[k * 4 + r] * gl[k * 4 + c];
        capture[r * 4 + c] = v;
      }
      double p = 0;
      for (int k = 0; k < 3; ++k) p += transform[k * 4 + r] * (gl[k * 4 + 3] / scale - transform[k * 4 + 3]);
      capture[r * 4 + 3] = p;
    }
    Camera cam;
    cam.camera_to_world = opengl_to_opencv(capture);
    // The dataset's world = capture_scale * capture + capture_offset (rotation unchanged).
    for (int r = 0; r < 3; ++r)
      cam.camera_to_world[r * 4 + 3] =
          meta.capture_scale * cam.camera_to_world[r * 4 + 3] + meta.capture_offset[r];
    cam.width = static_cast<int32_t>(width);
    cam.height = static_cast<int32_t>(height);
    // three.js's vertical field of view, as nerfstudio reads it: square pixels, centred.
    cam.fy = cam.fx = 0.5 * height / std::tan(fov * M_PI / 360.0);
    cam.cx = 0.5 * width;
    cam.cy = 0.5 * height;
    out.cameras.push_back(cam);
  }
  return out;
}

}  // namespace tessera::data
