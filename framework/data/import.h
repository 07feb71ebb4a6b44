// Importers of Blender/NeRF-synthetic, nerfstudio/instant-ngp and COLMAP datasets into the
// tessera-scene format, and the export to nerfstudio (docs/datasets.md): `tessera convert`.
#pragma once

#include <torch/types.h>

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "framework/data/scene.h"

namespace tessera::data {

// Every N-th image (0, N, 2N, ...) is held out for validation when the source names no splits:
// the convention of nerfstudio and of Mip-NeRF 360 ("every 8th image").
constexpr int kDefaultSplitEvery = 8;

enum class SourceFormat { Blender, Transforms, Colmap };
const char* to_string(SourceFormat format);  // "blender", "transforms", "colmap"

struct ImportOptions {
  int downscale = 1;                      // integer box-downscale factor, >= 1
  int split_every = kDefaultSplitEvery;   // >= 2; used when the source names no splits
  std::string images_dir;                 // COLMAP: the images folder (empty: INPUT/images)
  // transforms.json / COLMAP: an image whose size differs from its camera's (a folder already
  // downscaled, say by 4) rescales that camera's intrinsics to it instead of being refused; an
  // aspect change still is. Blender reads sizes from the images, so it has no effect there.
  bool images_scaled = false;
  // Center and scale real captures (nerfstudio/instant-ngp, COLMAP) into the canonical world
  // the models expect, recording the transform (docs/datasets.md, "Scene normalization").
  // false: keep the source's coordinates (`--keep-coordinates`).
  bool normalize = true;
};

// Called after each image: (images done, images in all).
using Progress = std::function<void(size_t done, size_t total)>;

// ---- Poses -------------------------------------------------------------------------------------
using Matrix4 = std::array<double, 16>;  // row-major 4x4

// OpenGL/Blender camera-to-world (x right, y up, z backward) to OpenCV (x right, y down, z
// forward): c2w * diag(1, -1, -1, 1). The same flip converts back.
Matrix4 opengl_to_opencv(const Matrix4& camera_to_world);
Matrix4 opencv_to_opengl(const Matrix4& camera_to_world);
// COLMAP world-to-camera (unit quaternion qw qx qy qz, translation t; OpenCV axes) to an OpenCV
// camera-to-world: [R^T | -R^T t]. The quaternion is normalized; a zero or non-finite one throws
// std::invalid_argument.
Matrix4 colmap_to_camera_to_world(const std::array<double, 4>& qvec,
                                  const std::array<double, 3>& tvec);

// Every `split_every`-th camera (indices 0, N, 2N, ...) becomes Val, the others Train (a lone
// camera stays Train).
void assign_interval_splits(std::vector<Camera>& cameras, int split_every);

// ---- Sources as parsed (full-resolution cameras, images not yet opened beyond headers) -------
// instant-ngp's box, with its meaning: a file point x lies at x * scale + offset in instant-ngp's
// space, whose unit cube [0, 1]^3 holds the object (the foreground); the box it trains in is that
// cube grown about its center to aabb_scale times its side, holding the backgrounds.
struct NgpBox {
  double scale = 0.33;                         // instant-ngp's default
  std::array<double, 3> offset{0.5, 0.5, 0.5};  // instant-ngp's default
  double aabb_scale = 1.0;
};

struct ParsedSource {
  SourceFormat format = SourceFormat::Blender;
  std::string label;                     // "blender", "nerfstudio", "instant-ngp", "colmap-text"...
  std::string path;                      // the file or folder that was read
  std::vector<Camera> cameras;           // full resolution, OpenCV poses, splits set
  std::vector<std::string> image_paths;  // one per camera
  torch::Tensor points_xyz;              // float32 [P, 3] (P = 0 when none)
  torch::Tensor points_rgb;              // uint8 [P, 3]
  std::optional<std::array<double, 6>> bounds;  // fixed by the format (Blender)
  std::optional<NgpBox> ngp;                    // instant-ngp's scale/offset/aabb_scale keys
  // A normalization recorded by a Tessera export (`tessera_capture_transform`): used as it is,
  // so that export and import round trip to the same world.
  std::optional<std::pair<double, std::array<double, 3>>> recorded_transform;
  std::optional<double> near, far;              // fixed by the format (Blender)
  std::string details;                          // extra text for the `source` attribute
};

ParsedSource parse_blender(const std::string& folder);
// `path`: a transforms.json file (nerfstudio or instant-ngp flavour).
ParsedSource parse_transforms(const std::string& path, int split_every);
// `model_dir`: the folder with cameras/images/points3D in .bin or .txt (binary preferred).
ParsedSource parse_colmap(const std::string& model_dir, const std::string& images_dir,
                          int split_every);

// A JSON file (transforms.json, a camera path). UserError naming it when it is missing,
// unreadable or malformed (with a hint when it holds NaN or Infinity, which JSON has not).
nlohmann::json load_json_file(const std::string& path);

// Reads x y z (float or double) and red green blue (uchar) of the vertices of an ASCII or
// binary_little_endian PLY file. Returns {xyz float64 [P, 3] (the import normalizes in float64,
// then stores float32), rgb uint8 [P, 3]}; a missing color is 255. Throws UserError naming the
// file.
std::pair<torch::Tensor, torch::Tensor> read_ply_points(const std::string& path);
// Writes a binary_little_endian PLY with float x y z (double when xyz is float64) and uchar red
// green blue.
void write_ply_points(const std::string& path, const torch::Tensor& xyz, const torch::Tensor& rgb);

// ---- The common path ---------------------------------------------------------------------------
struct ImageInfo {
  int width = 0, height = 0, channels = 0;
  bool has_alpha() const { return channels == 2 || channels == 4; }
};
// Reads only the header. Throws UserError naming the path when it is missing or not an image.
ImageInfo probe_image(const std::string& path);

// A source read, checked and ready to write: nothing can fail afterwards except I/O.
struct ImportedScene {
  SourceFormat format = SourceFormat::Blender;
  SceneMeta meta;
  std::vector<Camera> cameras;           // at the output resolution (after downscaling)
  std::vector<std::string> image_paths;  // one per camera
  int downscale = 1;
  bool has_alpha = false;                // some image has an alpha channel
  torch::Tensor points_xyz;              // float32 [P, 3]
  torch::Tensor points_rgb;              // uint8 [P, 3]
};

// Names the format found at `input` (a folder or a file), or throws UserError listing what was
// looked for.
SourceFormat detect_format(const std::string& input);
// Detects, parses and checks everything (every image header against its camera), downscales the
// intrinsics and derives bounds and near/far. Opens no output.
ImportedScene read_source(const std::string& input, const ImportOptions& options = {});
// The checks and derivations of read_source on an already parsed source.
ImportedScene finish_import(ParsedSource parsed, const ImportOptions& options);
// Decodes, downscales and writes every image through SceneWriter: `out_path` appears only when
// all of it was written (an existing file there is replaced).
void write_scene(const ImportedScene& scene, const std::string& out_path,
                 const Progress& progress = {});

// Scene bounds from points: per axis the 1st..99th percentile, each side pushed out by 10% of
// the extent. Returns xmin, ymin, zmin, xmax, ymax, zmax.
std::array<double, 6> bounds_from_points(const torch::Tensor& xyz);
// Bounds from camera centers (when there are no points): their box, each side pushed out by 10%
// of the largest extent (1 world unit for a single camera).
std::array<double, 6> bounds_from_cameras(const std::vector<Camera>& cameras);
// The import's normalization (docs/datasets.md, "Scene normalization"): world = scale * capture +
// offset, and the foreground box, the extent and near/far in world units.
struct Normalization {
  double scale = 1.0;
  std::array<double, 3> offset{0, 0, 0};
  std::array<double, 6> bounds{}, extent{};
  double near = 0, far = 0;
};
// With `ngp`: instant-ngp's unit cube becomes [-1, 1]^3 and its aabb_scale box the extent.
// Otherwise: the center is the point nearest to every camera's optical axis when the axes
// converge in front of the cameras (object captures), else the mean camera center; the scale puts
// the cameras at a median distance kCanonicalCameraDistance from it; the foreground is [-1, 1]^3
// and the extent [-kUnboundedExtent, kUnboundedExtent]^3 (grown to hold the cameras and the bulk of
// the points), or the foreground itself when `bounded` (images with alpha: nothing behind).
// `normalize` = false keeps the capture's coordinates (scale 1) with the same boxes mapped back.
// `recorded` (scale, offset) replaces the center and scale rule.
Normalization normalization_for(
    const std::vector<Camera>& cameras, const torch::Tensor& points_xyz,
    const std::optional<NgpBox>& ngp, bool bounded, bool normalize,
    const std::optional<std::pair<double, std::array<double, 3>>>& recorded = std::nullopt);
// Applies world = scale * capture + offset to camera centers and points (rotations unchanged).
void apply_normalization(const Normalization& n, std::vector<Camera>& cameras,
                         torch::Tensor& points_xyz);
// Records `n` in a scene's meta: its boxes (scene_bounds, scene_extent), near/far and the capture
// transform (capture_scale, capture_offset).
void record_normalization(const Normalization& n, SceneMeta& meta);

// near: the smallest distance from a camera center to the box, at least 1% of far; far: the
// largest distance from a camera center to a corner of the box.
std::pair<double, double> near_far_from_bounds(const std::array<double, 6>& bounds,
                                               const std::vector<Camera>& cameras);

// ---- Export ------------------------------------------------------------------------------------
// Writes `out_dir`/transforms.json, images/frame_NNNNN.png and points3D.ply (when the scene has
// points). Refuses (UserError) an `out_dir` that exists and is not empty.
void export_nerfstudio(const std::string& scene_path, const std::string& out_dir,
                       const Progress& progress = {});

}  // namespace tessera::data
