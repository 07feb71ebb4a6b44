// COLMAP sparse models, text (cameras.txt, images.txt, points3D.txt) and binary (.bin): cameras
// of the pinhole and radial models, world-to-camera poses, and the sparse points.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "distributed/errors.h"
#include "framework/data/import.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

// COLMAP's camera models in the order of their binary ids (colmap/src/colmap/sensor/models.h),
// with their parameter counts. Only the first five map onto Tessera's pinhole + OpenCV camera.
struct ModelInfo {
  const char* name;
  int params;
  bool supported;
};
constexpr ModelInfo kModels[] = {
    {"SIMPLE_PINHOLE", 3, true},       {"PINHOLE", 4, true},
    {"SIMPLE_RADIAL", 4, true},        {"RADIAL", 5, true},
    {"OPENCV", 8, true},               {"OPENCV_FISHEYE", 8, false},
    {"FULL_OPENCV", 12, false},        {"FOV", 5, false},
    {"SIMPLE_RADIAL_FISHEYE", 4, false}, {"RADIAL_FISHEYE", 5, false},
    {"THIN_PRISM_FISHEYE", 12, false}, {"RAD_TAN_THIN_PRISM_FISHEYE", 16, false}};
constexpr const char* kSupportedModels = "SIMPLE_PINHOLE, PINHOLE, SIMPLE_RADIAL, RADIAL, OPENCV";

struct ColmapCamera {
  int model = 0;  // index into kModels
  int64_t width = 0, height = 0;
  std::vector<double> params;
};
struct ColmapImage {
  std::array<double, 4> qvec{};
  std::array<double, 3> tvec{};
  uint32_t camera_id = 0;
  std::string name;
};
struct ColmapModel {
  std::map<uint32_t, ColmapCamera> cameras;
  std::vector<ColmapImage> images;
  std::vector<float> xyz;     // 3 per point
  std::vector<uint8_t> rgb;   // 3 per point
};

[[noreturn]] void unsupported(const std::string& where, uint32_t id, const std::string& model) {
  throw UserError(where + ": camera " + std::to_string(id) + " uses the COLMAP model " + model +
                  ", which Tessera does not support (supported: " + kSupportedModels +
                  "); undistort the images first (colmap image_undistorter)");
}

// ---- Text --------------------------------------------------------------------------------------

// The lines of a text file that are neither empty nor comments, with their line numbers.
std::ifstream open_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError(path + ": cannot open (missing or unreadable)");
  return in;
}

bool content_line(std::string& line) {
  const auto first = line.find_first_not_of(" \t\r");
  if (first == std::string::npos) return false;
  line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
  return line[0] != '#';
}

void read_cameras_text(const std::string& path, ColmapModel& model) {
  std::ifstream in = open_text(path);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!content_line(line)) continue;
    const std::string where = path + ":" + std::to_string(number);
    std::istringstream fields(line);
    uint32_t id = 0;
    std::string name;
    ColmapCamera camera;
    if (!(fields >> id >> name >> camera.width >> camera.height))
      throw UserError(where + ": expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS...");
    const auto* found = std::find_if(std::begin(kModels), std::end(kModels),
                                     [&](const ModelInfo& m) { return name == m.name; });
    if (found == std::end(kModels) || !found->supported) unsupported(where, id, name);
    camera.model = static_cast<int>(found - std::begin(kModels));
    for (double value; fields >> value;) camera.params.push_back(value);
    if (!fields.eof() || static_cast<int>(camera.params.size()) != found->params)
      throw UserError(where + ": model " + name + " takes " + std::to_string(found->params) +
                      " numeric parameters");
    model.cameras[id] = camera;
  }
}

void read_images_text(const std::string& path, ColmapModel& model) {
  std::ifstream in = open_text(path);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!content_line(line)) continue;
    std::istringstream fields(line);
    uint32_t id = 0;
    ColmapImage image;
    if (!(fields >> id >> image.qvec[0] >> image.qvec[1] >> image.qvec[2] >> image.qvec[3] >>
          image.tvec[0] >> image.tvec[1] >> image.tvec[2] >> image.camera_id) ||
        !std::getline(fields >> std::ws, image.name) || image.name.empty())
      throw UserError(path + ":" + std::to_string(number) +
                      ": expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME");
    model.images.push_back(image);
    std::getline(in, line);  // the POINTS2D line that follows every image (may be empty)
    ++number;
  }
}

void read_points_text(const std::string& path, ColmapModel& model) {
  std::ifstream in = open_text(path);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!content_line(line)) continue;
    std::istringstream fields(line);
    uint64_t id = 0;
    double x, y, z;
    int r, g, b;
    if (!(fields >> id >> x >> y >> z >> r >> g >> b))
      throw UserError(path + ":" + std::to_string(number) + ": expected POINT3D_ID X Y Z R G B ...");
    model.xyz.insert(model.xyz.end(), {static_cast<float>(x), static_cast<float>(y), static_cast<float>(z)});
    for (int c : {r, g, b}) model.rgb.push_back(static_cast<uint8_t>(std::clamp(c, 0, 255)));
  }
}

// ---- Binary (little-endian, as COLMAP writes it) -----------------------------------------------

class Bytes {
 public:
  explicit Bytes(const std::string& path) : path_(path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UserError(path + ": cannot open (missing or unreadable)");
    data_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::string get_string() {  // NUL-terminated
    const size_t end = data_.find('\0', at_);
    if (end == std::string::npos) truncated();
    std::string value = data_.substr(at_, end - at_);
    at_ = end + 1;
    return value;
  }
  void skip(uint64_t bytes) {
    need(bytes);
    at_ += bytes;
  }
  // A count read from the file, refused when it cannot fit in what is left (a corrupt file).
  uint64_t count(size_t min_bytes_each) {
    const auto n = get<uint64_t>();
    if (min_bytes_each > 0 && n > (data_.size() - at_) / min_bytes_each) truncated();
    return n;
  }
  const std::string& path() const { return path_; }

 private:
  void need(uint64_t bytes) {
    if (bytes > data_.size() - at_) truncated();
  }
  [[noreturn]] void truncated() const {
    throw UserError(path_ + ": truncated or corrupt COLMAP binary file (at byte " +
                    std::to_string(at_) + " of " + std::to_string(data_.size()) + ")");
  }
  std::string path_;
  std::string data_;
  size_t at_ = 0;
};

void read_cameras_binary(const std::string& path, ColmapModel& model) {
  Bytes in(path);
  const uint64_t count = in.count(24);
  for (uint64_t i = 0; i < count; ++i) {
    const auto id = in.get<uint32_t>();
    const auto model_id = in.get<int32_t>();
    ColmapCamera camera;
    camera.width = static_cast<int64_t>(in.get<uint64_t>());
    camera.height = static_cast<int64_t>(in.get<uint64_t>());
    if (model_id < 0 || model_id >= static_cast<int>(std::size(kModels)))
      unsupported(path, id, "with id " + std::to_string(model_id));
    if (!kModels[model_id].supported) unsupported(path, id, kModels[model_id].name);
    camera.model = model_id;
    for (int p = 0; p < kModels[model_id].params; ++p) camera.params.push_back(in.get<double>());
    model.cameras[id] = camera;
  }
}

void read_images_binary(const std::string& path, ColmapModel& model) {
  Bytes in(path);
  const uint64_t count = in.count(64);
  for (uint64_t i = 0; i < count; ++i) {
    ColmapImage image;
    in.get<uint32_t>();  // image id
    for (double& q : image.qvec) q = in.get<double>();
    for (double& t : image.tvec) t = in.get<double>();
    image.camera_id = in.get<uint32_t>();
    image.name = in.get_string();
    const uint64_t points2d = in.count(24);
    in.skip(points2d * 24);  // x, y (double) and point3D_id (int64) per 2D point
    model.images.push_back(image);
  }
}

void read_points_binary(const std::string& path, ColmapModel& model) {
  Bytes in(path);
  const uint64_t count = in.count(43);
  model.xyz.reserve(count * 3);
  model.rgb.reserve(count * 3);
  for (uint64_t i = 0; i < count; ++i) {
    in.get<uint64_t>();  // point id
    for (int a = 0; a < 3; ++a) model.xyz.push_back(static_cast<float>(in.get<double>()));
    for (int c = 0; c < 3; ++c) model.rgb.push_back(in.get<uint8_t>());
    in.get<double>();  // reprojection error
    const uint64_t track = in.count(8);
    in.skip(track * 8);  // image id and point2D index (int32 each) per observation
  }
}

Camera to_camera(const ColmapCamera& c) {
  Camera camera;
  camera.width = static_cast<int32_t>(c.width);
  camera.height = static_cast<int32_t>(c.height);
  const std::vector<double>& p = c.params;
  switch (c.model) {
    case 0:  // SIMPLE_PINHOLE: f, cx, cy
    case 2:  // SIMPLE_RADIAL: f, cx, cy, k
    case 3:  // RADIAL: f, cx, cy, k1, k2
      camera.fx = camera.fy = p[0];
      camera.cx = p[1];
      camera.cy = p[2];
      if (c.model >= 2) camera.k1 = p[3];
      if (c.model == 3) camera.k2 = p[4];
      break;
    case 1:  // PINHOLE: fx, fy, cx, cy
    case 4:  // OPENCV: fx, fy, cx, cy, k1, k2, p1, p2
      camera.fx = p[0];
      camera.fy = p[1];
      camera.cx = p[2];
      camera.cy = p[3];
      if (c.model == 4) {
        camera.k1 = p[4];
        camera.k2 = p[5];
        camera.p1 = p[6];
        camera.p2 = p[7];
      }
      break;
    default: break;  // refused when read
  }
  return camera;
}

}  // namespace

ParsedSource parse_colmap(const std::string& model_dir, const std::string& images_dir,
                          int split_every) {
  const fs::path dir(model_dir);
  const bool binary = fs::exists(dir / "cameras.bin") && fs::exists(dir / "images.bin");
  const std::string ext = binary ? ".bin" : ".txt";
  ColmapModel model;
  const std::string cameras_path = (dir / ("cameras" + ext)).string();
  const std::string images_path = (dir / ("images" + ext)).string();
  const std::string points_path = (dir / ("points3D" + ext)).string();
  if (binary) {
    read_cameras_binary(cameras_path, model);
    read_images_binary(images_path, model);
    if (fs::exists(points_path)) read_points_binary(points_path, model);
  } else {
    read_cameras_text(cameras_path, model);
    read_images_text(images_path, model);
    if (fs::exists(points_path)) read_points_text(points_path, model);
  }
  if (model.images.empty()) throw UserError(images_path + ": the model has no registered images");

  // Sorted by name, for a camera order that does not depend on COLMAP's image ids.
  std::sort(model.images.begin(), model.images.end(),
            [](const ColmapImage& a, const ColmapImage& b) { return a.name < b.name; });
  ParsedSource out;
  out.format = SourceFormat::Colmap;
  out.label = binary ? "colmap-binary" : "colmap-text";
  out.path = model_dir;
  out.details = "images=" + images_dir;
  for (size_t i = 0; i < model.images.size(); ++i) {
    const ColmapImage& image = model.images[i];
    const std::string where = images_path + ": image '" + image.name + "'";
    if (i > 0 && image.name == model.images[i - 1].name)
      throw UserError(where + " is registered twice");
    const auto found = model.cameras.find(image.camera_id);
    if (found == model.cameras.end())
      throw UserError(where + " refers to camera " + std::to_string(image.camera_id) +
                      ", which " + cameras_path + " does not define");
    Camera camera = to_camera(found->second);
    try {
      camera.camera_to_world = colmap_to_camera_to_world(image.qvec, image.tvec);
    } catch (const std::invalid_argument& e) {
      throw UserError(where + ": unusable pose: " + e.what());
    }
    validate_camera(camera, i, where);
    out.cameras.push_back(camera);
    out.image_paths.push_back((fs::path(images_dir) / image.name).lexically_normal().string());
  }
  assign_interval_splits(out.cameras, split_every);
  const auto points = static_cast<int64_t>(model.xyz.size() / 3);
  out.points_xyz = torch::from_blob(model.xyz.data(), {points, 3}, torch::kFloat32).clone();
  out.points_rgb = torch::from_blob(model.rgb.data(), {points, 3}, torch::kUInt8).clone();
  return out;
}

}  // namespace tessera::data
