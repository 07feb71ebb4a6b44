// Export of a tessera-scene file to a nerfstudio dataset folder: transforms.json (per-frame
// OpenCV intrinsics, OpenGL poses, split lists), images/*.png and points3D.ply.
#include <unistd.h>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "distributed/errors.h"
#include "framework/data/image_io.h"
#include "framework/data/import.h"
#include "kernels/cpu/parallel.h"

namespace tessera::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kImagesFolder = "images";
constexpr const char* kPointsFile = "points3D.ply";
constexpr int kJsonIndent = 2;
// Images encoded at once per worker thread (as in import.cpp): keeps the threads busy while the
// batch stays small next to RAM.
constexpr int kImagesPerThread = 2;

std::string frame_name(size_t index) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s/frame_%05zu.png", kImagesFolder, index);
  return name;
}

// Removes the partial export unless released (a failed export leaves nothing behind).
struct PartialFolder {
  std::string path;
  ~PartialFolder() {
    if (path.empty()) return;
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

void export_nerfstudio(const std::string& scene_path, const std::string& out_dir,
                       const Progress& progress) {
  fs::path dir = fs::path(out_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "out/" names the folder "out"
  if (fs::exists(dir)) {
    if (!fs::is_directory(dir)) throw UserError(out_dir + " exists and is not a folder");
    if (!fs::is_empty(dir))
      throw UserError("refusing to write into " + out_dir + ": the folder is not empty (give a "
                      "new or empty folder)");
  }
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (!fs::is_directory(parent)) throw UserError("the parent folder of " + out_dir + " does not exist");
  const SceneReader reader(scene_path);  // validates the file before anything is written

  // Everything goes into a sibling folder first, renamed into place at the end.
  PartialFolder partial{(parent / (dir.filename().string() + ".partial-" +
                                   std::to_string(::getpid()))).string()};
  fs::create_directories(fs::path(partial.path) / kImagesFolder);

  // Back to the capture's own coordinates: capture = (world - capture_offset) / capture_scale.
  const SceneMeta& meta = reader.meta();
  std::vector<Camera> cameras = reader.cameras();
  for (Camera& c : cameras)
    for (int r = 0; r < 3; ++r)
      c.camera_to_world[r * 4 + 3] =
          (c.camera_to_world[r * 4 + 3] - meta.capture_offset[r]) / meta.capture_scale;
  json frames = json::array();
  json lists[3] = {json::array(), json::array(), json::array()};
  for (size_t i = 0; i < cameras.size(); ++i) {
    const Camera& c = cameras[i];
    const std::string name = frame_name(i);
    const Matrix4 gl = opencv_to_opengl(c.camera_to_world);
    json matrix = json::array();
    for (int r = 0; r < 4; ++r) matrix.push_back({gl[r * 4], gl[r * 4 + 1], gl[r * 4 + 2], gl[r * 4 + 3]});
    frames.push_back({{"file_path", name}, {"fl_x", c.fx}, {"fl_y", c.fy}, {"cx", c.cx},
                      {"cy", c.cy}, {"w", c.width}, {"h", c.height}, {"k1", c.k1},
                      {"k2", c.k2}, {"p1", c.p1}, {"p2", c.p2}, {"transform_matrix", matrix}});
    lists[static_cast<int>(c.split)].push_back(name);
  }
  // Images: read in order (one HDF5 handle), PNG-encoded in parallel, a batch at a time.
  const size_t total = cameras.size();
  const size_t batch = static_cast<size_t>(std::max(1, at::get_num_threads() * kImagesPerThread));
  std::vector<torch::Tensor> rgb(batch), alpha(batch);
  for (size_t first = 0; first < total; first += batch) {
    const size_t count = std::min(batch, total - first);
    for (size_t j = 0; j < count; ++j) {
      rgb[j] = reader.read_image(first + j);
      alpha[j] = reader.has_alpha() ? reader.read_alpha(first + j) : torch::Tensor();
    }
    tessera::parallel_for(0, static_cast<int64_t>(count), 1, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j)
        write_png((fs::path(partial.path) / frame_name(first + static_cast<size_t>(j))).string(),
                  rgb[static_cast<size_t>(j)], alpha[static_cast<size_t>(j)]);
    });
    if (progress)
      for (size_t j = 0; j < count; ++j) progress(first + j + 1, total);
  }
  json transforms = {{"camera_model", "OPENCV"}, {"frames", frames},
                     {"train_filenames", lists[0]}, {"val_filenames", lists[1]},
                     {"test_filenames", lists[2]}, {"tessera_source", reader.meta().source},
                     {"tessera_capture_transform",
                      {{"scale", meta.capture_scale}, {"offset", meta.capture_offset}}}};
  if (reader.has_points()) {
    const torch::Tensor offset = torch::tensor(
        {meta.capture_offset[0], meta.capture_offset[1], meta.capture_offset[2]}, torch::kFloat64);
    const torch::Tensor xyz =  // float64: written as double, so nothing is rounded
        (reader.read_points_xyz().to(torch::kFloat64) - offset) / meta.capture_scale;
    write_ply_points((fs::path(partial.path) / kPointsFile).string(), xyz,
                     reader.read_points_rgb());
    transforms["ply_file_path"] = kPointsFile;
  }
  const std::string json_path = (fs::path(partial.path) / "transforms.json").string();
  std::ofstream out(json_path);
  out << transforms.dump(kJsonIndent) << "\n";
  if (!out.flush()) throw UserError("cannot write " + json_path + " (disk full?)");
  out.close();
  if (fs::exists(dir)) fs::remove(dir);  // empty (checked above); rename needs it gone or empty
  fs::rename(partial.path, dir);
  partial.path.clear();
}

}  // namespace tessera::data
