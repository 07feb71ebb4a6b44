// The `tessera synth` ray caster: textures, Lambert shading, OpenCV cameras (lens.h), anti-aliased
// rendering in parallel over rows, and surface points. Shares no code with any model renderer.
#include "framework/data/synth.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "framework/data/lens.h"
#include "kernels/cpu/parallel.h"

namespace tessera::data::synth {

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kInf = std::numeric_limits<double>::infinity();
// Subsample offsets from the pixel center: a rotated 2x2 grid (RGSS), which resolves near-vertical
// and near-horizontal edges into 4 distinct levels where a square grid gives only 2.
constexpr double kSubsamples[kSamplesPerPixel][2] = {
    {-0.125, -0.375}, {0.375, -0.125}, {0.125, 0.375}, {-0.375, 0.125}};
// Rows per at::parallel_for task are chosen so that a task holds at least this many pixels, which
// keeps the scheduling cost negligible next to the ray casting.
constexpr int64_t kPixelsPerTask = 4096;
// Position noise of the surface points, relative to the scene's bounding-box diagonal: SfM points
// are not exactly on the surface.
constexpr double kPointNoiseRel = 0.002;
// Random pixels tried per requested point before giving up (a view may show mostly background).
constexpr int kPointAttemptsPerPoint = 50;
// Random-stream id of the surface points (see Rng).
constexpr uint64_t kStreamPoints = 3;

double fract(double x) { return x - std::floor(x); }

Vec3 mix(const Vec3& a, const Vec3& b, double w) { return a * (1 - w) + b * w; }

uint8_t to_byte(double v) {
  return static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 1.0) * 255.0));
}

}  // namespace

// ---- Random numbers --------------------------------------------------------------------------

Rng::Rng(uint64_t seed, uint64_t stream)
    : state_(seed * 0x9E3779B97F4A7C15ULL + (stream + 1) * 0xD1B54A32D192ED03ULL) {
  next();
}

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
double Rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * kPi * u2);
}
size_t Rng::index(size_t n) { return static_cast<size_t>(uniform() * static_cast<double>(n)); }

// ---- Textures and shapes ----------------------------------------------------------------------

Vec3 texture_color(const Texture& texture, const Vec3& local_point) {
  switch (texture.pattern) {
    case Pattern::Solid:
      return texture.color_a;
    case Pattern::Checker: {
      const Vec3 p = (local_point + texture.phase) * (1.0 / texture.period);
      const auto cells = static_cast<long long>(std::floor(p.x)) +
                         static_cast<long long>(std::floor(p.y)) +
                         static_cast<long long>(std::floor(p.z));
      return (cells & 1) ? texture.color_b : texture.color_a;
    }
    case Pattern::Stripes: {
      const double s = dot(local_point, texture.axis) / texture.period + texture.phase.x;
      return fract(s) < 0.5 ? texture.color_a : texture.color_b;
    }
    case Pattern::Gradient: {
      // A smooth periodic ramp a -> b -> a along the axis, with a slow second ramp across it so
      // that no two points of a face share a color.
      const double s = dot(local_point, texture.axis) / texture.period + texture.phase.x;
      const double w = 0.5 - 0.5 * std::cos(2 * kPi * s);
      const double across = length(local_point - texture.axis * dot(local_point, texture.axis));
      const double v = 0.85 + 0.15 * std::cos(2 * kPi * (across / texture.period + texture.phase.y));
      return mix(texture.color_a, texture.color_b, w) * v;
    }
  }
  return texture.color_a;
}

bool intersect_shape(const Shape& shape, const Ray& ray, double t_min, double t_max,
                     Intersection* hit) {
  switch (shape.kind) {
    case ShapeKind::Sphere:
      return intersect_sphere(ray, shape.frame.center, shape.radius, t_min, t_max, hit);
    case ShapeKind::Box:
      return intersect_oriented_box(ray, shape.frame, shape.half_extents, t_min, t_max, hit);
    case ShapeKind::Torus:
      return intersect_torus(ray, shape.frame, shape.major, shape.minor, t_min, t_max, hit);
  }
  return false;
}

double sdf_shape(const Shape& shape, const Vec3& p) {
  switch (shape.kind) {
    case ShapeKind::Sphere:
      return sdf_sphere(p, shape.frame.center, shape.radius);
    case ShapeKind::Box:
      return sdf_box(p, shape.frame, shape.half_extents);
    case ShapeKind::Torus:
      return sdf_torus(p, shape.frame, shape.major, shape.minor);
  }
  return kInf;
}

double bounding_radius(const Shape& shape) {
  switch (shape.kind) {
    case ShapeKind::Sphere:
      return shape.radius;
    case ShapeKind::Box:
      return length(shape.half_extents);
    case ShapeKind::Torus:
      return shape.major + shape.minor;
  }
  return 0;
}

// ---- Cameras ----------------------------------------------------------------------------------

Split split_of_view(size_t index) {
  if (index % 8 == 0) return Split::Val;
  if (index % 8 == 4) return Split::Test;
  return Split::Train;
}

std::array<double, 16> look_at(const Vec3& eye, const Vec3& target) {
  const Vec3 forward = normalize(target - eye);
  Vec3 right = cross(forward, Vec3{0, 0, 1});
  // Looking straight up or down: any right vector perpendicular to forward will do.
  if (length(right) < 1e-9) right = cross(forward, Vec3{0, 1, 0});
  right = normalize(right);
  const Vec3 down = cross(forward, right);  // right x down = forward (right-handed)
  return {right.x, down.x, forward.x, eye.x,  //
          right.y, down.y, forward.y, eye.y,  //
          right.z, down.z, forward.z, eye.z,  //
          0,       0,      0,         1};
}

Camera pinhole_camera(int width, int height, double fov_deg, const std::array<double, 16>& c2w) {
  Camera camera;
  camera.width = width;
  camera.height = height;
  camera.fx = camera.fy = 0.5 * width / std::tan(0.5 * fov_deg * kPi / 180.0);
  camera.cx = 0.5 * width;
  camera.cy = 0.5 * height;
  camera.camera_to_world = c2w;
  return camera;
}

Ray camera_ray(const Camera& camera, double px, double py) {
  const auto& m = camera.camera_to_world;
  Vec3 d{(px - camera.cx) / camera.fx, (py - camera.cy) / camera.fy, 1.0};
  if (has_distortion(camera)) undistort(camera, d.x, d.y, &d.x, &d.y);
  const Vec3 world{m[0] * d.x + m[1] * d.y + m[2] * d.z, m[4] * d.x + m[5] * d.y + m[6] * d.z,
                   m[8] * d.x + m[9] * d.y + m[10] * d.z};
  return {{m[3], m[7], m[11]}, normalize(world)};
}

bool project(const Camera& camera, const Vec3& world, double* px, double* py) {
  const auto& m = camera.camera_to_world;
  const Vec3 v = world - Vec3{m[3], m[7], m[11]};
  // world_to_camera rotation = transpose of the camera_to_world rotation.
  const Vec3 c{m[0] * v.x + m[4] * v.y + m[8] * v.z, m[1] * v.x + m[5] * v.y + m[9] * v.z,
               m[2] * v.x + m[6] * v.y + m[10] * v.z};
  if (c.z <= 0) return false;
  if (!has_distortion(camera)) {
    *px = camera.fx * c.x / c.z + camera.cx;
    *py = camera.fy * c.y / c.z + camera.cy;
    return true;
  }
  double x, y;
  distort(camera, c.x / c.z, c.y / c.z, &x, &y);
  *px = camera.fx * x + camera.cx;
  *py = camera.fy * y + camera.cy;
  return true;
}

// ---- Tracing and shading ----------------------------------------------------------------------

SurfaceHit trace(const SynthScene& scene, const Ray& ray) {
  SurfaceHit best;
  double t_max = kInf;
  Intersection hit;
  for (size_t i = 0; i < scene.shapes.size(); ++i) {
    // Cheap rejection by the bounding sphere: missed, behind, or beyond the nearest hit so far.
    const Shape& shape = scene.shapes[i];
    const double radius = bounding_radius(shape);
    const Vec3 oc = shape.frame.center - ray.origin;
    const double along = dot(oc, ray.direction);
    if (dot(oc, oc) - along * along > radius * radius || along + radius < 0 ||
        along - radius > t_max)
      continue;
    if (intersect_shape(shape, ray, 0.0, t_max, &hit)) {
      t_max = hit.t;
      best.shape = static_cast<int>(i);
      best.t = hit.t;
      best.normal = hit.normal;
    }
  }
  if (best.shape >= 0) {
    best.point = ray.at(best.t);
    if (dot(best.normal, ray.direction) > 0) best.normal = -best.normal;
  }
  return best;
}

Vec3 shade(const SynthScene& scene, const SurfaceHit& hit) {
  const Shape& shape = scene.shapes.at(static_cast<size_t>(hit.shape));
  const Vec3 albedo = texture_color(shape.texture, shape.frame.to_local(hit.point));
  const Light& light = scene.light;
  const Vec3 to_light =
      light.is_point ? normalize(light.position - hit.point) : normalize(light.direction);
  const double lambert = std::max(0.0, dot(hit.normal, to_light));
  return albedo * (light.ambient + (1.0 - light.ambient) * lambert);
}

RenderedView render_view(const SynthScene& scene, size_t index) {
  const Camera& camera = scene.cameras.at(index);
  const int64_t width = camera.width, height = camera.height;
  RenderedView view;
  view.rgb = torch::empty({height, width, 3}, torch::kUInt8);
  if (scene.with_alpha) view.alpha = torch::empty({height, width}, torch::kUInt8);
  uint8_t* rgb = view.rgb.data_ptr<uint8_t>();
  uint8_t* alpha = scene.with_alpha ? view.alpha.data_ptr<uint8_t>() : nullptr;
  const Vec3 background{scene.meta.background[0], scene.meta.background[1],
                        scene.meta.background[2]};
  const int64_t grain = std::max<int64_t>(1, kPixelsPerTask / std::max<int64_t>(1, width));
  tessera::parallel_for(0, height, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t v = row_begin; v < row_end; ++v) {
      for (int64_t u = 0; u < width; ++u) {
        Vec3 sum;
        int hits = 0;
        for (const auto& offset : kSubsamples) {
          const Ray ray = camera_ray(camera, u + 0.5 + offset[0], v + 0.5 + offset[1]);
          const SurfaceHit hit = trace(scene, ray);
          if (hit.shape < 0) continue;
          sum = sum + shade(scene, hit);
          ++hits;
        }
        Vec3 color;
        if (scene.with_alpha) {
          color = hits > 0 ? sum * (1.0 / hits) : background;  // straight color, see RenderedView
          alpha[v * width + u] = to_byte(static_cast<double>(hits) / kSamplesPerPixel);
        } else {
          color = (sum + background * (kSamplesPerPixel - hits)) * (1.0 / kSamplesPerPixel);
        }
        uint8_t* out = rgb + (v * width + u) * 3;
        out[0] = to_byte(color.x);
        out[1] = to_byte(color.y);
        out[2] = to_byte(color.z);
      }
    }
  });
  return view;
}

SurfacePoints sample_surface_points(const SynthScene& scene, int count) {
  Rng rng(scene.options.seed, kStreamPoints);
  const auto& b = scene.meta.scene_bounds;
  const double noise = kPointNoiseRel * length(Vec3{b[3] - b[0], b[4] - b[1], b[5] - b[2]});
  std::vector<float> xyz;
  std::vector<uint8_t> rgb;
  const int64_t attempts = static_cast<int64_t>(count) * kPointAttemptsPerPoint;
  for (int64_t i = 0; i < attempts && static_cast<int>(rgb.size() / 3) < count; ++i) {
    const Camera& camera = scene.cameras[rng.index(scene.cameras.size())];
    const double px = rng.uniform(0, camera.width), py = rng.uniform(0, camera.height);
    const SurfaceHit hit = trace(scene, camera_ray(camera, px, py));
    if (hit.shape < 0) continue;
    const Vec3 color = shade(scene, hit);
    const Vec3 p = hit.point + Vec3{rng.normal(), rng.normal(), rng.normal()} * noise;
    xyz.insert(xyz.end(), {static_cast<float>(p.x), static_cast<float>(p.y),
                           static_cast<float>(p.z)});
    rgb.insert(rgb.end(), {to_byte(color.x), to_byte(color.y), to_byte(color.z)});
  }
  const auto n = static_cast<int64_t>(rgb.size() / 3);
  SurfacePoints points;
  points.xyz = torch::from_blob(xyz.data(), {n, 3}, torch::kFloat32).clone();
  points.rgb = torch::from_blob(rgb.data(), {n, 3}, torch::kUInt8).clone();
  return points;
}

}  // namespace tessera::data::synth
