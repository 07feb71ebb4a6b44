// The two transforms.json flavours: Blender/NeRF-synthetic (transforms_{train,val,test}.json with
// camera_angle_x) and nerfstudio/instant-ngp (one transforms.json with fl_x.. or camera_angle_x).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "distributed/errors.h"
#include "framework/data/import.h"

namespace tessera::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The NeRF-synthetic scenes fit in [-1.5, 1.5]^3 and are rendered from a sphere of radius ~4:
// the original NeRF code (and nerfstudio's blender parser) use these bounds and near 2, far 6.
constexpr double kBlenderHalfExtent = 1.5;
constexpr double kBlenderNear = 2.0;
constexpr double kBlenderFar = 6.0;
constexpr const char* kBlenderSplitFiles[] = {"transforms_train.json", "transforms_val.json",
                                              "transforms_test.json"};
constexpr Split kBlenderSplits[] = {Split::Train, Split::Val, Split::Test};
constexpr double kPi = 3.14159265358979323846;


std::string describe(const std::string& path, size_t index, const std::string& file_path) {
  return path + ": frame " + std::to_string(index) +
         (file_path.empty() ? std::string() : " ('" + file_path + "')");
}

// The value of `key` in `frame`, else in `top`, else null (nerfstudio's per-frame overrides).
const json* lookup(const json& frame, const json& top, const char* key) {
  if (frame.is_object() && frame.contains(key)) return &frame[key];
  if (top.contains(key)) return &top[key];
  return nullptr;
}

double as_number(const json& value, const std::string& where, const char* key) {
  if (!value.is_number()) throw UserError(where + ": '" + key + "' must be a number, got " + value.dump());
  const double number = value.get<double>();
  if (!std::isfinite(number)) throw UserError(where + ": '" + key + "' is not finite");
  return number;
}

int as_size(const json& value, const std::string& where, const char* key) {
  const double number = as_number(value, where, key);
  if (number < 1 || number != std::floor(number) || number > 1e6)
    throw UserError(where + ": '" + key + "' must be a positive whole number of pixels, got " +
                    value.dump());
  return static_cast<int>(number);
}

std::string file_path_of(const json& frame, const std::string& where) {
  if (!frame.is_object() || !frame.contains("file_path") || !frame["file_path"].is_string())
    throw UserError(where + ": needs a string 'file_path'");
  return frame["file_path"].get<std::string>();
}

// transform_matrix: 4x4 (or 3x4, the last row implied) of numbers; OpenGL camera-to-world.
Matrix4 matrix_of(const json& frame, const std::string& where) {
  if (!frame.contains("transform_matrix"))
    throw UserError(where + ": needs 'transform_matrix' (4x4 camera-to-world)");
  const json& rows = frame["transform_matrix"];
  if (!rows.is_array() || (rows.size() != 4 && rows.size() != 3))
    throw UserError(where + ": 'transform_matrix' must be a 4x4 array of numbers");
  Matrix4 m{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].is_array() || rows[r].size() != 4)
      throw UserError(where + ": 'transform_matrix' must be a 4x4 array of numbers");
    for (size_t c = 0; c < 4; ++c) {
      if (!rows[r][c].is_number())
        throw UserError(where + ": 'transform_matrix' must be a 4x4 array of numbers, got " +
                        rows[r][c].dump() + " at [" + std::to_string(r) + "][" + std::to_string(c) + "]");
      m[r * 4 + c] = rows[r][c].get<double>();
    }
  }
  return m;
}

// A frame's image: relative paths are taken from the JSON file's folder; "./" is dropped.
std::string resolve(const fs::path& folder, const std::string& file_path) {
  return (folder / fs::path(file_path)).lexically_normal().string();
}

bool has_image_extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

double focal_from_angle(double angle, int pixels, const std::string& where, const char* key) {
  if (!(angle > 0 && angle < kPi))
    throw UserError(where + ": '" + key + "' = " + std::to_string(angle) +
                    " must be a field of view in radians in (0, pi)");
  return 0.5 * pixels / std::tan(0.5 * angle);
}

}  // namespace

nlohmann::json load_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open (missing or unreadable)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    std::string hint;
    const std::string body = text.str();
    if (body.find("NaN") != std::string::npos || body.find("Infinity") != std::string::npos)
      hint = " (NaN and Infinity are not JSON: the file holds a non-finite number)";
    throw UserError(path + ": malformed JSON: " + e.what() + hint);
  }
}

ParsedSource parse_blender(const std::string& folder) {
  ParsedSource out;
  out.format = SourceFormat::Blender;
  out.label = "blender";
  out.path = folder;
  for (size_t s = 0; s < std::size(kBlenderSplitFiles); ++s) {
    const std::string path = (fs::path(folder) / kBlenderSplitFiles[s]).string();
    if (s > 0 && !fs::exists(path)) continue;  // only the train file is required
    const json meta = load_json_file(path);
    if (!meta.is_object() || !meta.contains("frames") || !meta["frames"].is_array())
      throw UserError(path + ": needs a 'frames' array");
    if (!meta.contains("camera_angle_x"))
      throw UserError(path + ": needs 'camera_angle_x' (horizontal field of view, radians)");
    const double angle = as_number(meta["camera_angle_x"], path, "camera_angle_x");
    const json& frames = meta["frames"];
    for (size_t i = 0; i < frames.size(); ++i) {
      const std::string where = describe(path, i, "");
      const std::string file_path = file_path_of(frames[i], where);
      const std::string where_named = describe(path, i, file_path);
      // Blender's file_path has no extension: ".png" is appended (kept when already there).
      std::string image = resolve(fs::path(folder), file_path);
      if (!has_image_extension(image)) image += ".png";
      const ImageInfo info = probe_image(image);
      Camera camera;
      camera.width = info.width;
      camera.height = info.height;
      camera.fx = camera.fy = focal_from_angle(angle, info.width, path, "camera_angle_x");
      camera.cx = 0.5 * info.width;
      camera.cy = 0.5 * info.height;
      camera.camera_to_world = opengl_to_opencv(matrix_of(frames[i], where_named));
      camera.split = kBlenderSplits[s];
      validate_camera(camera, i, where_named);
      out.cameras.push_back(camera);
      out.image_paths.push_back(image);
    }
  }
  if (out.cameras.empty())
    throw UserError((fs::path(folder) / kBlenderSplitFiles[0]).string() + ": no frames");
  constexpr double h = kBlenderHalfExtent;
  out.bounds = std::array<double, 6>{-h, -h, -h, h, h, h};
  out.near = kBlenderNear;
  out.far = kBlenderFar;
  return out;
}

ParsedSource parse_transforms(const std::string& path, int split_every) {
  const json meta = load_json_file(path);
  if (!meta.is_object() || !meta.contains("frames") || !meta["frames"].is_array() ||
      meta["frames"].empty())
    throw UserError(path + ": needs a non-empty 'frames' array");
  const fs::path folder = fs::path(path).parent_path();
  ParsedSource out;
  out.format = SourceFormat::Transforms;
  out.path = path;
  bool instant_ngp = meta.contains("aabb_scale");

  // nerfstudio sorts frames by file name; so do we (on the normalized path, "./" dropped), so
  // that "every N-th" picks the same frames.
  const json& frames = meta["frames"];
  std::vector<std::string> names(frames.size()), keys(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    names[i] = file_path_of(frames[i], describe(path, i, ""));
    keys[i] = resolve(folder, names[i]);
  }
  std::vector<size_t> order(frames.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return keys[a] < keys[b]; });

  for (size_t i : order) {
    const json& frame = frames[i];
    const std::string where = describe(path, i, names[i]);
    std::string image = resolve(folder, names[i]);
    std::error_code error;  // (file_path may name what the OS refuses: probe_image says so)
    if (!fs::exists(image, error) && !has_image_extension(image) && fs::exists(image + ".png", error))
      image += ".png";  // instant-ngp accepts NeRF-synthetic style paths without extension
    if (const json* model = lookup(frame, meta, "camera_model")) {
      const std::string name = model->is_string() ? model->get<std::string>() : model->dump();
      if (name != "OPENCV" && name != "PINHOLE" && name != "SIMPLE_PINHOLE")
        throw UserError(where + ": camera_model " + name + " is not supported (supported: "
                        "OPENCV, PINHOLE, SIMPLE_PINHOLE; undistort fisheye or equirectangular "
                        "images first)");
    }
    Camera camera;
    const json* w = lookup(frame, meta, "w");
    const json* h = lookup(frame, meta, "h");
    if (w && h) {
      camera.width = as_size(*w, where, "w");
      camera.height = as_size(*h, where, "h");
    } else {  // instant-ngp may leave the size to the image
      const ImageInfo info = probe_image(image);
      camera.width = w ? as_size(*w, where, "w") : info.width;
      camera.height = h ? as_size(*h, where, "h") : info.height;
    }
    if (const json* fl_x = lookup(frame, meta, "fl_x")) {
      camera.fx = as_number(*fl_x, where, "fl_x");
    } else if (const json* angle = lookup(frame, meta, "camera_angle_x")) {
      camera.fx = focal_from_angle(as_number(*angle, where, "camera_angle_x"), camera.width,
                                   where, "camera_angle_x");
      instant_ngp = true;
    } else {
      throw UserError(where + ": needs 'fl_x' (or instant-ngp's 'camera_angle_x')");
    }
    if (const json* fl_y = lookup(frame, meta, "fl_y")) {
      camera.fy = as_number(*fl_y, where, "fl_y");
    } else if (const json* angle = lookup(frame, meta, "camera_angle_y")) {
      camera.fy = focal_from_angle(as_number(*angle, where, "camera_angle_y"), camera.height,
                                   where, "camera_angle_y");
    } else {
      camera.fy = camera.fx;  // square pixels
    }
    const json* cx = lookup(frame, meta, "cx");
    const json* cy = lookup(frame, meta, "cy");
    camera.cx = cx ? as_number(*cx, where, "cx") : 0.5 * camera.width;
    camera.cy = cy ? as_number(*cy, where, "cy") : 0.5 * camera.height;
    const std::pair<const char*, double*> distortion[] = {
        {"k1", &camera.k1}, {"k2", &camera.k2}, {"p1", &camera.p1}, {"p2", &camera.p2}};
    for (const auto& [key, field] : distortion)
      if (const json* value = lookup(frame, meta, key)) *field = as_number(*value, where, key);
    for (const char* key : {"k3", "k4"})
      if (const json* value = lookup(frame, meta, key); value && as_number(*value, where, key) != 0)
        throw UserError(where + ": '" + key + "' is not zero; Tessera models k1 k2 p1 p2 only "
                        "(undistort the images first)");
    camera.camera_to_world = opengl_to_opencv(matrix_of(frame, where));
    validate_camera(camera, i, where);
    out.cameras.push_back(camera);
    out.image_paths.push_back(image);
  }

  // Splits: the file's own lists when it has any, else every N-th frame is val.
  const char* list_keys[] = {"train_filenames", "val_filenames", "test_filenames"};
  std::map<std::string, Split> listed;
  bool has_lists = false;
  for (size_t s = 0; s < 3; ++s) {
    if (!meta.contains(list_keys[s])) continue;
    has_lists = true;
    const json& list = meta[list_keys[s]];
    if (!list.is_array()) throw UserError(path + ": '" + list_keys[s] + "' must be a list of file names");
    for (const json& name : list) {
      if (!name.is_string()) throw UserError(path + ": '" + list_keys[s] + "' must hold strings");
      const std::string key = resolve(folder, name.get<std::string>());
      if (!listed.emplace(key, static_cast<Split>(s)).second)
        throw UserError(path + ": " + name.get<std::string>() + " is listed in two splits");
    }
  }
  if (has_lists) {
    for (size_t k = 0; k < order.size(); ++k) {
      const auto found = listed.find(keys[order[k]]);
      if (found == listed.end())
        throw UserError(describe(path, order[k], names[order[k]]) +
                        " is in none of train_filenames, val_filenames, test_filenames");
      out.cameras[k].split = found->second;
    }
  } else {
    assign_interval_splits(out.cameras, split_every);
  }

  if (meta.contains("aabb_scale") || meta.contains("scale") || meta.contains("offset")) {
    NgpBox box;
    std::ostringstream details;
    if (meta.contains("aabb_scale")) {
      box.aabb_scale = as_number(meta["aabb_scale"], path, "aabb_scale");
      if (!(box.aabb_scale > 0)) throw UserError(path + ": 'aabb_scale' must be > 0");
      details << "aabb_scale=" << box.aabb_scale;
    }
    if (meta.contains("scale")) {
      box.scale = as_number(meta["scale"], path, "scale");
      if (!(box.scale > 0)) throw UserError(path + ": 'scale' must be > 0");
    }
    if (meta.contains("offset")) {
      const json& offset = meta["offset"];
      if (!offset.is_array() || offset.size() != 3)
        throw UserError(path + ": 'offset' must be an array of 3 numbers");
      for (int a = 0; a < 3; ++a) box.offset[a] = as_number(offset[a], path, "offset");
    }
    out.ngp = box;
    out.details = details.str();
  }
  if (meta.contains("tessera_capture_transform")) {  // a Tessera export: its own normalization
    const json& t = meta["tessera_capture_transform"];
    if (!t.is_object() || !t.contains("scale") || !t.contains("offset") ||
        !t["offset"].is_array() || t["offset"].size() != 3)
      throw UserError(path + ": 'tessera_capture_transform' must be {\"scale\": s, \"offset\": [x, y, z]}");
    std::array<double, 3> offset{};
    for (int a = 0; a < 3; ++a) offset[a] = as_number(t["offset"][a], path, "tessera_capture_transform");
    const double scale = as_number(t["scale"], path, "tessera_capture_transform");
    if (!(scale > 0)) throw UserError(path + ": 'tessera_capture_transform' scale must be > 0");
    out.recorded_transform = std::make_pair(scale, offset);
  }
  if (meta.contains("ply_file_path")) {  // nerfstudio's sparse points (ns-process-data, export)
    if (!meta["ply_file_path"].is_string()) throw UserError(path + ": 'ply_file_path' must be a string");
    std::tie(out.points_xyz, out.points_rgb) =
        read_ply_points(resolve(folder, meta["ply_file_path"].get<std::string>()));
  }
  out.label = instant_ngp ? "instant-ngp" : "nerfstudio";
  return out;
}

}  // namespace tessera::data
