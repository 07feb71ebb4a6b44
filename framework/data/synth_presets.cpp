// The `tessera synth` presets: `objects` (textured primitives on white, cameras on a hemisphere),
// `tabletop` (the same objects on a table under a far dome, written as a photo capture is imported)
// and `room` (an enclosed textured room, cameras inside looking outward). Pure functions of options.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/data/lens.h"
#include "framework/data/synth.h"

namespace tessera::data::synth {

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kDeg = kPi / 180.0;
// Random-stream ids (see Rng): each part of a scene draws from its own stream, so that e.g. the
// number of views never changes the objects.
constexpr uint64_t kStreamShapes = 1;
constexpr uint64_t kStreamCameras = 2;
constexpr uint64_t kStreamBackdrop = 3;

// objects: primitives are placed in a disc of this radius (world units) around the origin, at
// heights within +-kObjectsHeight, at least kObjectsGap apart (bounding spheres).
constexpr double kObjectsDisc = 1.0;
constexpr double kObjectsHeight = 0.35;
constexpr double kObjectsGap = 0.05;
// Tries per object before the disc is widened a little; the layout stays deterministic.
constexpr int kPlacementTries = 200;
// Camera elevations above the objects' horizontal plane, NeRF-synthetic style upper hemisphere.
constexpr double kMinElevationDeg = 5.0;
constexpr double kMaxElevationDeg = 75.0;
// The bounding sphere fills at most this fraction of the narrower half field of view.
constexpr double kFramingFill = 0.95;
// Relative jitter of the camera distance, so that views do not all share one radius.
constexpr double kDistanceJitter = 0.05;
// Margin added around bounds and near/far (world units).
constexpr double kBoundsMargin = 0.05;

// tabletop: the table reaches this many camera distances from the objects' center, and its top
// lies kTableGap below their lowest point; the dome's radius is kDomeRadius camera distances.
constexpr double kTableReach = 2.0;
constexpr double kTableGap = 0.02;
constexpr double kTableThickness = 0.1;
constexpr double kDomeRadius = 5.0;

// room: the interior is [-kRoomX, kRoomX] x [-kRoomY, kRoomY] x [0, kRoomZ]; walls are slabs of
// kWallThickness just outside it.
constexpr double kRoomX = 4.0, kRoomY = 3.0, kRoomZ = 3.0;
constexpr double kWallThickness = 0.1;
// Cameras sit on an ellipse of these radii (fractions of the half extents) at eye height, turned
// outward by up to kYawSpreadDeg either way and pitched within [kMinPitchDeg, kMaxPitchDeg].
constexpr double kRingFraction = 0.3;
constexpr double kMinEyeHeight = 1.2, kMaxEyeHeight = 1.8;
constexpr double kYawSpreadDeg = 75.0;
constexpr double kMinPitchDeg = -40.0, kMaxPitchDeg = 10.0;
// A camera keeps at least this distance from every surface (re-drawn otherwise).
constexpr double kCameraClearance = 0.3;
constexpr int kCameraTries = 100;

// A color that is never close to the white background: at least one channel well below 1.
Vec3 random_color(Rng& rng) {
  Vec3 c{rng.uniform(0.1, 0.95), rng.uniform(0.1, 0.95), rng.uniform(0.1, 0.95)};
  if (std::min({c.x, c.y, c.z}) > 0.6) c.z = rng.uniform(0.1, 0.4);
  return c;
}

Vec3 random_unit(Rng& rng) {
  const double z = rng.uniform(-1, 1), phi = rng.uniform(0, 2 * kPi);
  const double r = std::sqrt(1 - z * z);
  return {r * std::cos(phi), r * std::sin(phi), z};
}

// A textured pattern (checker, stripes or gradient) with two clearly different colors.
Texture random_texture(Rng& rng, double period) {
  Texture texture;
  const int kind = static_cast<int>(rng.index(3));
  texture.pattern = kind == 0 ? Pattern::Checker : kind == 1 ? Pattern::Stripes : Pattern::Gradient;
  texture.color_a = random_color(rng);
  do {
    texture.color_b = random_color(rng);
  } while (length(texture.color_b - texture.color_a) < 0.35);
  texture.period = period * rng.uniform(0.7, 1.3);
  texture.axis = random_unit(rng);
  texture.phase = {rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, 1)};
  return texture;
}

// The exact world AABB of a shape: xmin, ymin, zmin, xmax, ymax, zmax.
std::array<double, 6> shape_bounds(const Shape& s) {
  Vec3 extent;
  const auto& r = s.frame.rotation;
  if (s.kind == ShapeKind::Sphere) {
    extent = {s.radius, s.radius, s.radius};
  } else if (s.kind == ShapeKind::Box) {
    const Vec3& h = s.half_extents;
    extent = {std::abs(r[0]) * h.x + std::abs(r[1]) * h.y + std::abs(r[2]) * h.z,
              std::abs(r[3]) * h.x + std::abs(r[4]) * h.y + std::abs(r[5]) * h.z,
              std::abs(r[6]) * h.x + std::abs(r[7]) * h.y + std::abs(r[8]) * h.z};
  } else {  // torus: the ring's extent along world axis i is major * sqrt(1 - axis_i^2)
    const Vec3 axis{r[2], r[5], r[8]};
    auto ext = [&](double a) { return s.major * std::sqrt(std::max(0.0, 1 - a * a)) + s.minor; };
    extent = {ext(axis.x), ext(axis.y), ext(axis.z)};
  }
  const Vec3& c = s.frame.center;
  return {c.x - extent.x, c.y - extent.y, c.z - extent.z,
          c.x + extent.x, c.y + extent.y, c.z + extent.z};
}

std::array<double, 6> union_bounds(const std::vector<Shape>& shapes, double margin) {
  std::array<double, 6> b{1e300, 1e300, 1e300, -1e300, -1e300, -1e300};
  for (const Shape& s : shapes) {
    const auto sb = shape_bounds(s);
    for (int i = 0; i < 3; ++i) {
      b[i] = std::min(b[i], sb[i] - margin);
      b[i + 3] = std::max(b[i + 3], sb[i + 3] + margin);
    }
  }
  return b;
}

// The half field of view of the narrower image side, in radians.
double narrow_half_fov(int width, int height) {
  const double tan_h = std::tan(0.5 * kFieldOfViewDeg * kDeg);  // horizontal, by definition
  const double tan_v = tan_h * height / width;
  return std::atan(std::min(tan_h, tan_v));
}

// Every camera of a preset: the pinhole of the options' size and the fixed field of view, with the
// options' lens distortion (which changes where pixels look, not the pose or the intrinsics).
Camera preset_camera(const SynthOptions& o, const std::array<double, 16>& c2w) {
  Camera camera = pinhole_camera(o.width, o.height, kFieldOfViewDeg, c2w);
  camera.k1 = o.distortion[0], camera.k2 = o.distortion[1];
  camera.p1 = o.distortion[2], camera.p2 = o.distortion[3];
  return camera;
}

// The widest angle between the optical axis and the ray of any image point: at the farthest image
// corner for a pinhole, wherever the lens sends the border furthest out otherwise.
double widest_ray_angle(const SynthOptions& o) {
  const Camera camera = preset_camera(o, look_at({0, 0, 0}, {1, 0, 0}));
  if (has_distortion(camera)) return std::atan(max_ray_tangent(camera));
  const double tan_h = std::tan(0.5 * kFieldOfViewDeg * kDeg);
  return std::atan(tan_h * std::hypot(1.0, static_cast<double>(o.height) / o.width));
}

// ---- objects --------------------------------------------------------------------------------

void build_objects(SynthScene& scene) {
  const SynthOptions& o = scene.options;
  Rng rng(o.seed, kStreamShapes);
  const ShapeKind kinds[] = {ShapeKind::Sphere, ShapeKind::Box,   ShapeKind::Torus,
                             ShapeKind::Sphere, ShapeKind::Box,   ShapeKind::Torus,
                             ShapeKind::Sphere};
  double disc = kObjectsDisc;
  for (size_t i = 0; i < std::size(kinds); ++i) {
    Shape s;
    s.kind = kinds[i];
    // The first box stays axis-aligned and the first torus keeps a vertical axis; the others
    // turn about a random axis.
    const bool rotated = i >= 3;
    if (s.kind == ShapeKind::Sphere) s.radius = rng.uniform(0.18, 0.32);
    if (s.kind == ShapeKind::Box)
      s.half_extents = {rng.uniform(0.12, 0.28), rng.uniform(0.12, 0.28), rng.uniform(0.12, 0.28)};
    if (s.kind == ShapeKind::Torus) s.major = rng.uniform(0.22, 0.32), s.minor = rng.uniform(0.06, 0.1);
    if (rotated && s.kind != ShapeKind::Sphere) {
      // Draws in separate statements: the order of a call's arguments is up to the compiler.
      const double angle = rng.uniform(0.3, 1.3);
      const Vec3 axis = random_unit(rng);
      s.frame.rotation = axis_angle_rotation(axis, angle);
    }
    s.texture = random_texture(rng, 0.15);
    for (int attempt = 0;; ++attempt) {
      if (attempt > 0 && attempt % kPlacementTries == 0) disc *= 1.1;
      const double r = disc * std::sqrt(rng.uniform()), phi = rng.uniform(0, 2 * kPi);
      s.frame.center = {r * std::cos(phi), r * std::sin(phi),
                        rng.uniform(-kObjectsHeight, kObjectsHeight)};
      bool clear = true;
      for (const Shape& other : scene.shapes)
        clear = clear && length(other.frame.center - s.frame.center) >
                             bounding_radius(other) + bounding_radius(s) + kObjectsGap;
      if (clear) break;
    }
    scene.shapes.push_back(s);
  }
  scene.light.is_point = false;
  scene.light.direction = normalize(Vec3{0.4, -0.3, 0.85});
  scene.light.ambient = 0.35;
  scene.with_alpha = true;
  scene.meta.background = {1, 1, 1};
  scene.meta.scene_bounds = union_bounds(scene.shapes, kBoundsMargin);

  // Cameras: a golden-angle spiral over the upper hemisphere (equal area per view), turned by a
  // random angle, all looking at the center of the bounds.
  const auto& b = scene.meta.scene_bounds;
  const Vec3 center{0.5 * (b[0] + b[3]), 0.5 * (b[1] + b[4]), 0.5 * (b[2] + b[5])};
  double radius = 0;  // bounding sphere of the shapes about `center`
  for (const Shape& s : scene.shapes)
    radius = std::max(radius, length(s.frame.center - center) + bounding_radius(s));
  const double distance = radius / std::sin(kFramingFill * narrow_half_fov(o.width, o.height));
  Rng cam_rng(o.seed, kStreamCameras);
  const double turn = cam_rng.uniform(0, 2 * kPi);
  const double golden = kPi * (3.0 - std::sqrt(5.0));
  const double z_lo = std::sin(kMinElevationDeg * kDeg), z_hi = std::sin(kMaxElevationDeg * kDeg);
  double d_min = 1e300, d_max = 0;
  for (int i = 0; i < o.views; ++i) {
    const double z = z_lo + (z_hi - z_lo) * (i + 0.5) / o.views;
    const double phi = turn + golden * i;
    const double d = distance * (1 + kDistanceJitter * cam_rng.uniform(-1, 1));
    const double rxy = std::sqrt(1 - z * z);
    const Vec3 eye = center + Vec3{rxy * std::cos(phi), rxy * std::sin(phi), z} * d;
    scene.cameras.push_back(preset_camera(o, look_at(eye, center)));
    d_min = std::min(d_min, d), d_max = std::max(d_max, d);
  }
  // Every surface point lies in the bounding sphere, so both its distance and its depth along the
  // optical axis are within [d - radius, d + radius] for a camera at distance d.
  scene.meta.near = std::max(kBoundsMargin, d_min - radius - kBoundsMargin);
  scene.meta.far = d_max + radius + kBoundsMargin;
}

// ---- tabletop -------------------------------------------------------------------------------

// The objects and cameras of `objects` (same seed, same objects and poses) standing on a textured
// table inside a textured dome, so that every ray ends on a surface: a photo capture of objects on a
// table in a room, with no alpha. It is written as `tessera convert` imports a photo capture:
// normalized and unbounded (write_synth_scene, SynthScene::as_capture), with the near plane close to
// the cameras, which is where a radiance field's floaters grow (docs/synth.md).
void build_tabletop(SynthScene& scene) {
  build_objects(scene);
  const auto& b = scene.meta.scene_bounds;
  const Vec3 center{0.5 * (b[0] + b[3]), 0.5 * (b[1] + b[4]), 0.5 * (b[2] + b[5])};
  double distance = 0;  // the mean camera distance
  for (const Camera& camera : scene.cameras) {
    const auto& m = camera.camera_to_world;
    distance += length(Vec3{m[3], m[7], m[11]} - center) / static_cast<double>(scene.cameras.size());
  }
  Rng rng(scene.options.seed, kStreamBackdrop);
  Shape table;
  table.kind = ShapeKind::Box;
  const double reach = kTableReach * distance, half = 0.5 * kTableThickness;
  table.half_extents = {reach, reach, half};
  table.frame.center = {center.x, center.y, b[2] + kBoundsMargin - kTableGap - half};
  table.texture = random_texture(rng, 0.3);
  table.texture.pattern = Pattern::Checker;
  Shape dome;
  dome.radius = kDomeRadius * distance;
  dome.frame.center = center;
  dome.texture = random_texture(rng, 0.4 * dome.radius);
  dome.texture.pattern = Pattern::Stripes;
  scene.shapes.push_back(table);
  scene.shapes.push_back(dome);
  scene.with_alpha = false;
  scene.as_capture = true;  // bounds, extent and near/far are the import's (write_synth_scene)
}

// ---- room -----------------------------------------------------------------------------------

Shape slab(const Vec3& center, const Vec3& half_extents, const Texture& texture) {
  Shape s;
  s.kind = ShapeKind::Box;
  s.frame.center = center;
  s.half_extents = half_extents;
  s.texture = texture;
  return s;
}

void build_room(SynthScene& scene) {
  const SynthOptions& o = scene.options;
  Rng rng(o.seed, kStreamShapes);
  const double t = 0.5 * kWallThickness;
  // Floor tiles, a smooth ceiling, and four walls with four different looks.
  Texture floor = random_texture(rng, 0.5);
  floor.pattern = Pattern::Checker;
  Texture ceiling = random_texture(rng, 4.0);
  ceiling.pattern = Pattern::Gradient;
  Texture walls[4];
  const Pattern wall_patterns[4] = {Pattern::Stripes, Pattern::Checker, Pattern::Gradient,
                                    Pattern::Stripes};
  for (int i = 0; i < 4; ++i) {
    walls[i] = random_texture(rng, i == 1 ? 0.4 : i == 2 ? 1.5 : 0.5);
    walls[i].pattern = wall_patterns[i];
  }
  walls[0].axis = {0, 1, 0};            // vertical stripes on +x
  walls[3].axis = normalize(Vec3{1, 0, 1});  // diagonal stripes on -y
  const double X = kRoomX + t, Y = kRoomY + t, Z = kRoomZ + t;
  scene.shapes.push_back(slab({0, 0, -t}, {X, Y, t}, floor));
  scene.shapes.push_back(slab({0, 0, kRoomZ + t}, {X, Y, t}, ceiling));
  scene.shapes.push_back(slab({kRoomX + t, 0, 0.5 * kRoomZ}, {t, Y, Z}, walls[0]));
  scene.shapes.push_back(slab({0, kRoomY + t, 0.5 * kRoomZ}, {X, t, Z}, walls[1]));
  scene.shapes.push_back(slab({-kRoomX - t, 0, 0.5 * kRoomZ}, {t, Y, Z}, walls[2]));
  scene.shapes.push_back(slab({0, -kRoomY - t, 0.5 * kRoomZ}, {X, t, Z}, walls[3]));

  // Furniture: a table in the middle with a ball on it, a cabinet against one wall with a ring on
  // top, a shelf on another with a ball, a turned crate in a corner, a ring on the floor, a
  // standing hoop and a pedestal with a ball.
  auto add_box = [&](const Vec3& center, const Vec3& half, double turn, double period) {
    Shape s = slab(center, half, random_texture(rng, period));
    if (turn != 0) s.frame.rotation = axis_angle_rotation({0, 0, 1}, turn);
    scene.shapes.push_back(s);
    return s;
  };
  auto add_ball = [&](const Vec3& center, double radius) {
    Shape s;
    s.radius = radius;
    s.frame.center = center;
    s.texture = random_texture(rng, 0.1);
    scene.shapes.push_back(s);
  };
  auto add_ring = [&](const Vec3& center, double major, double minor, const Vec3& axis) {
    Shape s;
    s.kind = ShapeKind::Torus;
    s.major = major, s.minor = minor;
    s.frame.center = center;
    const Vec3 z{0, 0, 1};
    if (length(cross(z, axis)) > 1e-9)
      s.frame.rotation = axis_angle_rotation(cross(z, axis), std::acos(dot(z, normalize(axis))));
    s.texture = random_texture(rng, 0.12);
    scene.shapes.push_back(s);
  };
  const double table_h = 0.75;
  const double table_turn = rng.uniform(-0.3, 0.3);  // before the position (as above)
  const double table_x = rng.uniform(-0.3, 0.3), table_y = rng.uniform(-0.2, 0.2);
  const Shape table = add_box({table_x, table_y, 0.5 * table_h}, {0.6, 0.4, 0.5 * table_h},
                              table_turn, 0.2);
  add_ball(table.frame.center + Vec3{rng.uniform(-0.3, 0.3), 0, 0.5 * table_h + 0.2}, 0.2);
  const double cabinet_x = rng.uniform(-2.5, 2.5);
  add_box({cabinet_x, kRoomY - 0.3, 0.9}, {0.5, 0.3, 0.9}, 0, 0.3);
  add_ring({cabinet_x, kRoomY - 0.3, 1.8 + 0.07}, 0.2, 0.07, {0, 0, 1});
  const double shelf_y = rng.uniform(-1.5, 1.5);
  add_box({-kRoomX + 0.25, shelf_y, 1.1}, {0.25, 0.8, 0.04}, 0, 0.2);
  add_ball({-kRoomX + 0.25, shelf_y + rng.uniform(-0.5, 0.5), 1.14 + 0.15}, 0.15);
  add_box({-kRoomX + 0.6, -kRoomY + 0.6, 0.35}, {0.35, 0.35, 0.35}, rng.uniform(0.2, 1.2), 0.2);
  add_ring({kRoomX - 0.8, rng.uniform(-2.0, 0.0), 0.12}, 0.4, 0.12, {0, 0, 1});
  add_ring({rng.uniform(-2.5, 0.0), -kRoomY + 0.4, 0.58}, 0.5, 0.08, {0, 1, 0});
  const Vec3 pedestal{kRoomX - 0.6, kRoomY - 0.6, 0.5};
  add_box(pedestal, {0.2, 0.2, 0.5}, rng.uniform(0, 1.5), 0.15);
  add_ball(pedestal + Vec3{0, 0, 0.5 + 0.25}, 0.25);

  scene.light.is_point = true;
  scene.light.position = {0.5, -0.3, kRoomZ - 0.6};
  scene.light.ambient = 0.35;
  scene.with_alpha = false;
  scene.meta.background = {1, 1, 1};  // never seen: every ray hits a wall
  scene.meta.scene_bounds = {-kRoomX - kBoundsMargin, -kRoomY - kBoundsMargin, -kBoundsMargin,
                             kRoomX + kBoundsMargin,  kRoomY + kBoundsMargin,  kRoomZ + kBoundsMargin};

  // Cameras: around an ellipse at eye height, looking outward with varied yaw and pitch, like a
  // walk-around indoor capture. A pose too close to a surface is drawn again.
  Rng cam_rng(o.seed, kStreamCameras);
  double clearance_min = 1e300;
  for (int i = 0; i < o.views; ++i) {
    Vec3 eye, dir;
    double clearance = 0;
    for (int attempt = 0; attempt < kCameraTries && clearance < kCameraClearance; ++attempt) {
      const double theta = 2 * kPi * (i + cam_rng.uniform(-0.3, 0.3)) / o.views;
      const double ring_scale = cam_rng.uniform(0.8, 1.2) * kRingFraction;
      eye = {ring_scale * kRoomX * std::cos(theta), ring_scale * kRoomY * std::sin(theta),
             cam_rng.uniform(kMinEyeHeight, kMaxEyeHeight)};
      const double yaw = theta + cam_rng.uniform(-kYawSpreadDeg, kYawSpreadDeg) * kDeg;
      const double pitch = cam_rng.uniform(kMinPitchDeg, kMaxPitchDeg) * kDeg;
      dir = {std::cos(pitch) * std::cos(yaw), std::cos(pitch) * std::sin(yaw), std::sin(pitch)};
      clearance = 1e300;
      for (const Shape& s : scene.shapes) clearance = std::min(clearance, sdf_shape(s, eye));
    }
    if (clearance < kCameraClearance)
      throw std::logic_error("synth room: no clear camera position for view " + std::to_string(i));
    clearance_min = std::min(clearance_min, clearance);
    scene.cameras.push_back(preset_camera(o, look_at(eye, eye + dir)));
  }
  // Every visible point is at least `clearance_min` away, hence at depth >= that times the cosine
  // of the widest ray angle; nothing inside the room is farther than its diagonal.
  scene.meta.near = 0.95 * clearance_min * std::cos(widest_ray_angle(o));
  scene.meta.far = std::sqrt(4 * kRoomX * kRoomX + 4 * kRoomY * kRoomY + kRoomZ * kRoomZ) +
                   kBoundsMargin;
}

// "K1,K2,P1,P2" as given (shortest round-trip form of each double).
std::string distortion_text(const std::array<double, 4>& d) {
  std::string text;
  for (double v : d) {
    char number[32];
    std::snprintf(number, sizeof number, "%.17g", v);
    for (int precision = 1; precision < 17; ++precision) {  // shortest that reads back exactly
      char shorter[32];
      std::snprintf(shorter, sizeof shorter, "%.*g", precision, v);
      if (std::strtod(shorter, nullptr) == v) {
        std::snprintf(number, sizeof number, "%s", shorter);
        break;
      }
    }
    text += (text.empty() ? "" : ",") + std::string(number);
  }
  return text;
}

using PresetBuilder = std::function<void(SynthScene&)>;
const std::map<std::string, PresetBuilder>& presets() {
  static const std::map<std::string, PresetBuilder> table = {
      {"objects", build_objects}, {"room", build_room}, {"tabletop", build_tabletop}};
  return table;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, builder] : presets()) names.push_back(name);
  return names;
}

void validate_options(const SynthOptions& options) {
  if (presets().count(options.preset) == 0) {
    std::string known;
    for (const auto& name : preset_names()) known += (known.empty() ? "" : ", ") + name;
    throw UserError("unknown synth preset '" + options.preset + "' (known presets: " + known +
                    "; and `shapes`, point clouds of procedural shapes)");
  }
  if (options.views < kMinViews)
    throw UserError("--views " + std::to_string(options.views) + " is too few: need at least " +
                    std::to_string(kMinViews) +
                    " (view 0 is val, the next ones train; test views start at view 4)");
  for (const auto& [flag, value] : {std::pair{"--width", options.width},
                                    std::pair{"--height", options.height}}) {
    if (value < kMinSide || value > kMaxSide)
      throw UserError(std::string(flag) + " " + std::to_string(value) + " is out of range: use " +
                      std::to_string(kMinSide) + " to " + std::to_string(kMaxSide) + " pixels");
  }
  const char* names[4] = {"K1", "K2", "P1", "P2"};
  for (int i = 0; i < 4; ++i)
    if (!std::isfinite(options.distortion[i]))
      throw UserError("--distortion " + distortion_text(options.distortion) + ": " + names[i] +
                      " is not finite; give four finite numbers K1,K2,P1,P2");
  // The lens must be invertible over the whole image: every pixel needs exactly one ray.
  const std::string problem =
      distortion_problem(preset_camera(options, look_at({0, 0, 0}, {1, 0, 0})));
  if (!problem.empty())
    throw UserError("--distortion " + distortion_text(options.distortion) + " is unusable for a " +
                    std::to_string(options.width) + "x" + std::to_string(options.height) +
                    " image: " + problem + "; use smaller coefficients");
}

SynthScene build_scene(const SynthOptions& options) {
  validate_options(options);
  SynthScene scene;
  scene.options = options;
  presets().at(options.preset)(scene);
  scene.meta.source = "synth:" + options.preset + " seed=" + std::to_string(options.seed) +
                      " views=" + std::to_string(options.views) + " " +
                      std::to_string(options.width) + "x" + std::to_string(options.height);
  if (has_distortion(scene.cameras.at(0)))
    scene.meta.source += " distortion=" + distortion_text(options.distortion);
  for (size_t i = 0; i < scene.cameras.size(); ++i) scene.cameras[i].split = split_of_view(i);
  return scene;
}

}  // namespace tessera::data::synth
