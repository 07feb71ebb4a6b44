// The tessera-scene v2 dataset (docs/formats.md): cameras, images, optional alpha
// and points, in one HDF5 file. SceneWriter streams it to a temporary name and renames it when
// complete; SceneReader validates it and reads only the images a rank asks for (hyperslabs).
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "framework/data/dataset.h"

namespace tessera::data {

constexpr const char* kSceneFormat = "tessera-scene";
// 2: sealed (framework/data/file_seal.h); version 1 files had no seal and are refused by it.
constexpr int kSceneVersion = 2;

// One pinhole camera with OpenCV distortion and an OpenCV-convention pose
// (x right, y down, z forward; camera_to_world maps camera coordinates to world coordinates).
struct Camera {
  double fx = 0, fy = 0, cx = 0, cy = 0;   // pixels
  double k1 = 0, k2 = 0, p1 = 0, p2 = 0;   // OpenCV order
  int32_t width = 0, height = 0;           // pixels
  std::array<double, 16> camera_to_world{  // row-major 4x4
      1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  Split split = Split::Train;
};

// Root attributes.
struct SceneMeta {
  std::array<double, 6> scene_bounds{};    // xmin, ymin, zmin, xmax, ymax, zmax (world units)
  double near = 0.0;                       // ray start distance
  double far = 0.0;                        // ray end distance
  std::array<double, 3> background{1, 1, 1};  // RGB in [0, 1] behind the scene
  std::string source;                      // what it was made from ("synth:objects", "colmap:/path")
  // Everything the cameras see (xmin..zmax). Equal to scene_bounds for a bounded scene (synthetic
  // objects, Blender); larger for a real capture whose backgrounds and walls lie outside the
  // foreground box scene_bounds: such a scene is unbounded (a radiance field contracts the space
  // beyond the box).
  std::array<double, 6> scene_extent{};
  // The import's normalization (docs/datasets.md): world = capture_scale * capture +
  // capture_offset, a similarity without rotation from the capture's own coordinates into the
  // canonical world the models expect. Identity when the source was used as it is.
  double capture_scale = 1.0;
  std::array<double, 3> capture_offset{0, 0, 0};

  // True when scene_extent reaches beyond scene_bounds on some side.
  bool unbounded() const;
};

// Throws UserError naming `origin` and the camera index when a camera is unusable: non-finite
// values, non-positive focal length or size, a rotation that is not orthonormal (tolerance
// 1e-3), or a last row other than (0, 0, 0, 1).
void validate_camera(const Camera& camera, size_t index, const std::string& origin);

// Writes a dataset. Every image is given once, in any order; commit() checks that all were
// written, closes the file and renames it into place. Destroying an uncommitted writer removes
// the temporary file, so a failed run never leaves a half-written dataset.
class SceneWriter {
 public:
  // `with_alpha`: whether /images/alpha is written (then every write_image passes alpha).
  SceneWriter(const std::string& path, const SceneMeta& meta, const std::vector<Camera>& cameras,
              bool with_alpha);
  ~SceneWriter();
  SceneWriter(const SceneWriter&) = delete;
  SceneWriter& operator=(const SceneWriter&) = delete;

  // rgb: uint8 [H, W, 3] with H, W the camera's size; alpha: uint8 [H, W] or undefined.
  void write_image(size_t index, const torch::Tensor& rgb, const torch::Tensor& alpha = {});
  // xyz: float32 [P, 3]; rgb: uint8 [P, 3]. Optional; at most once.
  void write_points(const torch::Tensor& xyz, const torch::Tensor& rgb);
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads a dataset. Opening validates the format, the version (a newer one is refused), the
// layout and every camera; problems throw UserError naming the file and what is wrong.
class SceneReader : public Dataset {
 public:
  explicit SceneReader(const std::string& path);
  ~SceneReader() override;
  SceneReader(const SceneReader&) = delete;
  SceneReader& operator=(const SceneReader&) = delete;

  const std::string& path() const override;
  const SceneMeta& meta() const;
  const std::vector<Camera>& cameras() const;
  int version() const;
  bool has_alpha() const;
  bool has_points() const;
  bool uniform_size() const;  // true when /images/rgb is one [C, H, W, 3] dataset

  torch::Tensor read_image(size_t index) const;  // uint8 [H, W, 3], that image only
  torch::Tensor read_alpha(size_t index) const;  // uint8 [H, W]; throws if !has_alpha()
  // The training and eval target: float32 [H, W, 3] in [0, 1], composited over the background
  // when the dataset has alpha (rgb is straight colour then).
  torch::Tensor read_image_over_background(size_t index) const;
  torch::Tensor read_points_xyz() const;         // float32 [P, 3] (P = 0 when none)
  torch::Tensor read_points_rgb() const;         // uint8 [P, 3]
  std::vector<size_t> indices(Split split) const override;  // camera indices, ascending
  // Of the bounds, near, far and every camera (not the pixels: a re-encoded image keeps it).
  std::string fingerprint() const override;
  std::string summary() const override;  // "24 cameras"
  std::string format_version() const override;
  // Source, file size, cameras per split, image sizes, intrinsics, distortion, bounds, extent,
  // normalization, near/far, background, alpha, points.
  std::vector<InfoLine> describe() const override;
  const SceneReader* as_scene() const override { return this; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::data
