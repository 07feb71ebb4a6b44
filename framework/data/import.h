// Importers of Blender/NeRF-synthetic, nerfstudio/instant-ngp and COLMAP datasets into the
// tessera-scene format, and the export to nerfstudio (docs/datasets.md): `tessera convert`.
#pragma once

#include <torch/torch.h>

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
struct ParsedSource {
  SourceFormat format = SourceFormat::Blender;
  std::string label;                     // "blender", "nerfstudio", "instant-ngp", "colmap-text"...
  std::string path;                      // the file or folder that was read
  std::vector<Camera> cameras;           // full resolution, OpenCV poses, splits set
  std::vector<std::string> image_paths;  // one per camera
  torch::Tensor points_xyz;              // float32 [P, 3] (P = 0 when none)
  torch::Tensor points_rgb;              // uint8 [P, 3]
  std::optional<std::array<double, 6>> bounds;  // fixed by the format (Blender, aabb_scale)
  std::optional<double> near, far;              // fixed by the format (Blender)
  std::string details;                          // extra text for the `source` attribute
};

ParsedSource parse_blender(const std::string& folder);
// `path`: a transforms.json file (nerfstudio or instant-ngp flavour).
ParsedSource parse_transforms(const std::string& path, int split_every);
// `model_dir`: the folder with cameras/images/points3D in .bin or .txt (binary preferred).
ParsedSource parse_colmap(const std::string& model_dir, const std::string& images_dir,
                          int split_every);

// Reads x y z (float or double) and red green blue (uchar) of the vertices of an ASCII or
// binary_little_endian PLY file. Returns {xyz float32 [P, 3], rgb uint8 [P, 3]}; a missing color
// is 255. Throws UserError naming the file.
std::pair<torch::Tensor, torch::Tensor> read_ply_points(const std::string& path);
// Writes a binary_little_endian PLY with float x y z and uchar red green blue.
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
