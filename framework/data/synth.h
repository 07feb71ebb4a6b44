// `tessera synth`: procedural scenes (presets) rendered by an exact analytic ray caster into a
// tessera-scene dataset, with known geometry, so that training can be checked against ground truth.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "framework/data/scene.h"
#include "framework/data/synth_geometry.h"

namespace tessera::data::synth {

// Defaults of `tessera synth` (docs/synth.md).
constexpr const char* kDefaultPreset = "objects";
constexpr int kDefaultViews = 100;
constexpr int kDefaultWidth = 128;
constexpr int kDefaultHeight = 128;
constexpr uint64_t kDefaultSeed = 0;
// Limits checked by validate_options: 3 views give one val view and two train views (test views
// appear from 5 views on, see split_of_view); under 8 pixels a side nothing is recognizable;
// over 8192 one image is >200 MB uncompressed.
constexpr int kMinViews = 3;
constexpr int kMinSide = 8;
constexpr int kMaxSide = 8192;
// Anti-aliasing subsamples per pixel (a fixed rotated grid, the same for every pixel).
constexpr int kSamplesPerPixel = 4;
// Horizontal field of view of every camera; fx = fy = (W / 2) / tan(fov / 2).
constexpr double kFieldOfViewDeg = 50.0;
// Colored surface points written to /points, as structure-from-motion would give.
constexpr int kSurfacePoints = 4000;

// Deterministic random numbers (SplitMix64): the same on every platform and standard library,
// which std::uniform_real_distribution does not promise. `stream` separates independent uses.
// Draw in separate statements (or inside one braced list, which is ordered): the arguments of
// one call are evaluated in an order each compiler picks, so f(rng.uniform(), rng.uniform())
// gives different scenes under gcc and clang.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream);
  uint64_t next();
  double uniform();                     // [0, 1)
  double uniform(double lo, double hi);  // [lo, hi)
  double normal();                      // standard normal (Box-Muller)
  size_t index(size_t n);               // [0, n)

 private:
  uint64_t state_;
};

struct SynthOptions {
  std::string preset = kDefaultPreset;
  int views = kDefaultViews;
  int width = kDefaultWidth;
  int height = kDefaultHeight;
  uint64_t seed = kDefaultSeed;
  // OpenCV k1, k2, p1, p2 of every camera (`--distortion`); all 0 gives pinhole cameras. The
  // poses and fx, fy, cx, cy do not depend on it: only where each pixel looks does.
  std::array<double, 4> distortion{0, 0, 0, 0};
};

// Procedural color as a function of the surface point in the shape's local frame.
enum class Pattern { Solid, Checker, Stripes, Gradient };
struct Texture {
  Pattern pattern = Pattern::Solid;
  Vec3 color_a{0.8, 0.8, 0.8};  // linear RGB in [0, 1]
  Vec3 color_b{0.2, 0.2, 0.2};
  double period = 1.0;          // world units per checker cell or stripe pair; gradient length
  Vec3 axis{0, 0, 1};           // stripes and gradient direction (unit, local frame)
  Vec3 phase;                   // checker offset, so that cell edges do not fall on box faces
};
Vec3 texture_color(const Texture& texture, const Vec3& local_point);

enum class ShapeKind { Sphere, Box, Torus };
// One primitive placed by `frame`. A box with the identity rotation is axis-aligned; a torus
// turns around the frame's local z axis.
struct Shape {
  ShapeKind kind = ShapeKind::Sphere;
  Frame frame;
  double radius = 0.5;            // sphere
  Vec3 half_extents{0.5, 0.5, 0.5};  // box
  double major = 0.5, minor = 0.15;  // torus
  Texture texture;
};
bool intersect_shape(const Shape& shape, const Ray& ray, double t_min, double t_max,
                     Intersection* hit);
double sdf_shape(const Shape& shape, const Vec3& p);
double bounding_radius(const Shape& shape);  // about frame.center

// Lambert shading: color = albedo * (ambient + (1 - ambient) * max(0, n . l)), with l towards a
// point light (`is_point`) or along a fixed direction.
struct Light {
  bool is_point = false;
  Vec3 direction{0.3, -0.5, 0.8};  // towards the light (directional); normalized on use
  Vec3 position;                   // point light
  double ambient = 0.3;
};

struct SynthScene {
  SynthOptions options;
  std::vector<Shape> shapes;
  Light light;
  bool with_alpha = false;  // objects on a background (alpha = coverage) vs. an enclosed room
  // Written as `tessera convert` writes a photo capture: normalized into the canonical frame with
  // the import's rule, unbounded, near/far and the capture transform recorded (write_synth_scene).
  // The scene itself (shapes, cameras, meta's bounds) stays in synth world units.
  bool as_capture = false;
  std::vector<Camera> cameras;
  SceneMeta meta;           // bounds, near, far, background and source
};

// The preset names, sorted.
std::vector<std::string> preset_names();
// Throws UserError for an unknown preset (listing the known ones), numbers out of range, or a
// distortion that is not finite or cannot be undistorted over the whole image (lens.h).
void validate_options(const SynthOptions& options);
// The scene and its cameras; a pure function of the options. Throws as validate_options.
SynthScene build_scene(const SynthOptions& options);

// The split of view `index`: every 8th view (index % 8 == 0) is val, index % 8 == 4 is test.
Split split_of_view(size_t index);
// A look-at pose in the OpenCV convention (x right, y down, z forward) with world +z up, as the
// row-major camera_to_world matrix.
std::array<double, 16> look_at(const Vec3& eye, const Vec3& target);
// A pinhole camera of the given size and horizontal field of view, centered principal point.
Camera pinhole_camera(int width, int height, double fov_deg, const std::array<double, 16>& c2w);
// The world ray through continuous pixel coordinates (px, py); pixel (u, v) has its center at
// (u + 0.5, v + 0.5). The pixel is undistorted through the camera's lens first (lens.h), so a
// distorted camera renders what a real lens would record.
Ray camera_ray(const Camera& camera, double px, double py);
// Where a world point lands in the image (continuous pixel coordinates, through the lens
// distortion); false behind the camera.
bool project(const Camera& camera, const Vec3& world, double* px, double* py);

// The nearest surface along a ray.
struct SurfaceHit {
  int shape = -1;  // -1: the ray hit nothing
  double t = 0;
  Vec3 point, normal;  // world; the normal faces the ray
};
SurfaceHit trace(const SynthScene& scene, const Ray& ray);
// The shaded color (linear RGB in [0, 1]) of a hit; it depends on the point and the normal only.
Vec3 shade(const SynthScene& scene, const SurfaceHit& hit);

struct RenderedView {
  torch::Tensor rgb;    // uint8 [H, W, 3]: mean color of the subsamples that hit (background
                        // where none did), i.e. straight (not premultiplied) color, as PNG RGBA
  torch::Tensor alpha;  // uint8 [H, W]: fraction of subsamples that hit; undefined without alpha
};
// Renders camera `index` (rows in parallel with at::parallel_for).
RenderedView render_view(const SynthScene& scene, size_t index);

struct SurfacePoints {
  torch::Tensor xyz;  // float32 [P, 3]
  torch::Tensor rgb;  // uint8 [P, 3]
};
// Points on surfaces that the cameras see (random pixels of random views, from the seed), colored
// by shade(), with a little position noise.
SurfacePoints sample_surface_points(const SynthScene& scene, int count);

struct SynthSummary {
  std::array<size_t, 3> views_per_split{};  // train, val, test
  int64_t points = 0;
  uint64_t file_bytes = 0;
  double seconds = 0;
};
// Called after each view is written, with (views done, views total).
using SynthProgress = std::function<void(size_t, size_t)>;
// Builds, renders and writes the dataset to `path` (atomically, via SceneWriter).
SynthSummary write_synth_scene(const SynthOptions& options, const std::string& path,
                               const SynthProgress& progress = {});

}  // namespace tessera::data::synth
