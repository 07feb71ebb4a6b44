// Tests of `tessera synth`: exact intersections against independent checks, OpenCV camera
// convention by projection, determinism, presets, points, and the dataset end to end (binary too).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "distributed/errors.h"
#include "framework/data/scene.h"
#include "framework/data/shapes.h"
#include "framework/data/synth.h"
#include "tests/test_util.h"

namespace tessera::data::synth {
namespace {

constexpr double kTol = 1e-9;  // closed-form distances in these tests are exact to rounding

Ray ray_from(const Vec3& origin, const Vec3& direction) { return {origin, normalize(direction)}; }

void expect_near(const Vec3& a, const Vec3& b, double tol) {
  EXPECT_NEAR(a.x, b.x, tol);
  EXPECT_NEAR(a.y, b.y, tol);
  EXPECT_NEAR(a.z, b.z, tol);
}

Frame random_frame(Rng& rng) {
  Frame f;
  f.rotation = axis_angle_rotation({rng.normal(), rng.normal(), rng.normal()}, rng.uniform(0, 6));
  f.center = {rng.uniform(-2, 2), rng.uniform(-2, 2), rng.uniform(-2, 2)};
  return f;
}

// ---- Intersections ---------------------------------------------------------------------------

TEST(SynthGeometry, SphereThroughCenterHitsAtDistanceMinusRadius) {
  Rng rng(7, 0);
  for (int i = 0; i < 100; ++i) {
    const Vec3 c{rng.uniform(-3, 3), rng.uniform(-3, 3), rng.uniform(-3, 3)};
    const double r = rng.uniform(0.1, 2);
    const Vec3 o = c + normalize(Vec3{rng.normal(), rng.normal(), rng.normal()}) *
                           (r + rng.uniform(0.01, 10));
    Intersection hit;
    ASSERT_TRUE(intersect_sphere(ray_from(o, c - o), c, r, 0, 1e30, &hit));
    EXPECT_NEAR(hit.t, length(c - o) - r, kTol * (1 + length(c - o)));
    expect_near(hit.normal, normalize(o - c), 1e-9);
    // From the center outward: the exit point, at exactly r.
    ASSERT_TRUE(intersect_sphere(ray_from(c, o - c), c, r, 0, 1e30, &hit));
    EXPECT_NEAR(hit.t, r, kTol);
    // Facing away: nothing ahead.
    EXPECT_FALSE(intersect_sphere(ray_from(o, o - c), c, r, 0, 1e30, &hit));
  }
}

TEST(SynthGeometry, SphereMissesBesideAndRespectsTMax) {
  Intersection hit;
  const Vec3 c{0, 0, 0};
  EXPECT_FALSE(intersect_sphere(ray_from({-5, 1.001, 0}, {1, 0, 0}), c, 1.0, 0, 1e30, &hit));
  ASSERT_TRUE(intersect_sphere(ray_from({-5, 0.999, 0}, {1, 0, 0}), c, 1.0, 0, 1e30, &hit));
  EXPECT_NEAR(hit.t, 5 - std::sqrt(1 - 0.999 * 0.999), 1e-9);
  EXPECT_FALSE(intersect_sphere(ray_from({-5, 0, 0}, {1, 0, 0}), c, 1.0, 0, 3.9, &hit));
}

TEST(SynthGeometry, BoxIsHitFromEachFace) {
  const Vec3 lo{-1, -2, -0.5}, hi{3, 1, 0.5};
  const Vec3 mid = (lo + hi) * 0.5;
  const double lo_a[3] = {lo.x, lo.y, lo.z}, hi_a[3] = {hi.x, hi.y, hi.z};
  for (int axis = 0; axis < 3; ++axis) {
    for (int side = 0; side < 2; ++side) {
      const double s = side == 0 ? -1.0 : 1.0;
      double n[3] = {0, 0, 0};
      n[axis] = s;
      const Vec3 normal{n[0], n[1], n[2]};
      const double face = side == 0 ? lo_a[axis] : hi_a[axis];
      const double mid_a[3] = {mid.x, mid.y, mid.z};
      const double gap = 2.5;  // origin this far outside the face, off the face's center a bit
      const Vec3 origin = mid + normal * (std::abs(face - mid_a[axis]) + gap) +
                          Vec3{axis == 0 ? 0 : 0.3, axis == 1 ? 0 : 0.2, axis == 2 ? 0 : 0.1};
      Intersection hit;
      ASSERT_TRUE(intersect_box(ray_from(origin, -normal), lo, hi, 0, 1e30, &hit))
          << "axis " << axis << " side " << side;
      EXPECT_NEAR(hit.t, gap, kTol);
      expect_near(hit.normal, normal, 0);
      // The same box as an oriented box in a random frame: the same t, a rotated normal.
      Rng rng(axis * 2 + side, 1);
      const Frame f = random_frame(rng);
      const Frame shifted{f.rotation, f.to_world(mid)};
      const Ray world{f.to_world(origin), f.to_world_dir(-normal)};
      ASSERT_TRUE(intersect_oriented_box(world, shifted, (hi - lo) * 0.5, 0, 1e30, &hit));
      EXPECT_NEAR(hit.t, gap, 1e-9);
      expect_near(hit.normal, f.to_world_dir(normal), 1e-12);
    }
  }
}

TEST(SynthGeometry, BoxMissesAndExitsFromInside) {
  const Vec3 lo{0, 0, 0}, hi{1, 1, 1};
  Intersection hit;
  EXPECT_FALSE(intersect_box(ray_from({-1, 1.5, 0.5}, {1, 0, 0}), lo, hi, 0, 1e30, &hit));
  EXPECT_FALSE(intersect_box(ray_from({-1, -1, 0.5}, {1, -0.1, 0}), lo, hi, 0, 1e30, &hit));
  EXPECT_FALSE(intersect_box(ray_from({2, 0.5, 0.5}, {1, 0, 0}), lo, hi, 0, 1e30, &hit));
  ASSERT_TRUE(intersect_box(ray_from({0.25, 0.5, 0.5}, {1, 0, 0}), lo, hi, 0, 1e30, &hit));
  EXPECT_NEAR(hit.t, 0.75, kTol);
  expect_near(hit.normal, {1, 0, 0}, 0);
}

TEST(SynthGeometry, TorusHitsOnTheAxisPlaneAtKnownDistances) {
  const double R = 1.0, r = 0.25;
  Frame f;  // axis z at the origin
  Intersection hit;
  // Along x through the center: four crossings at 3 -+ (R + r) and 3 -+ (R - r).
  const double expected[4] = {3 - R - r, 3 - R + r, 3 + R - r, 3 + R + r};
  double t_min = 0;
  for (double t : expected) {
    ASSERT_TRUE(intersect_torus(ray_from({-3, 0, 0}, {1, 0, 0}), f, R, r, t_min, 1e30, &hit));
    EXPECT_NEAR(hit.t, t, 1e-9);
    t_min = hit.t + 1e-6;
  }
  EXPECT_FALSE(intersect_torus(ray_from({-3, 0, 0}, {1, 0, 0}), f, R, r, t_min, 1e30, &hit));
  // Down through the tube's center circle: hits at 5 - r with normal +z.
  ASSERT_TRUE(intersect_torus(ray_from({R, 0, 5}, {0, 0, -1}), f, R, r, 0, 1e30, &hit));
  EXPECT_NEAR(hit.t, 5 - r, 1e-9);
  expect_near(hit.normal, {0, 0, 1}, 1e-9);
  // From the hole's center outward: the inner wall at R - r.
  ASSERT_TRUE(intersect_torus(ray_from({0, 0, 0}, {0, 1, 0}), f, R, r, 0, 1e30, &hit));
  EXPECT_NEAR(hit.t, R - r, 1e-9);
  expect_near(hit.normal, {0, -1, 0}, 1e-9);
  // Misses: down the axis (the hole), above the tube, beside the outer rim.
  EXPECT_FALSE(intersect_torus(ray_from({0, 0, 5}, {0, 0, -1}), f, R, r, 0, 1e30, &hit));
  EXPECT_FALSE(intersect_torus(ray_from({-3, 0, 0.26}, {1, 0, 0}), f, R, r, 0, 1e30, &hit));
  EXPECT_FALSE(intersect_torus(ray_from({-3, 1.26, 0}, {1, 0, 0}), f, R, r, 0, 1e30, &hit));
  // The same torus turned and moved: the same distances for the transformed ray.
  Rng rng(3, 0);
  const Frame g = random_frame(rng);
  ASSERT_TRUE(intersect_torus({g.to_world({-3, 0, 0}), g.to_world_dir({1, 0, 0})}, g, R, r, 0,
                              1e30, &hit));
  EXPECT_NEAR(hit.t, 3 - R - r, 1e-9);
  expect_near(hit.normal, g.to_world_dir({-1, 0, 0}), 1e-9);
}

// Sphere tracing on the exact SDF: an independent (slow) reference for the first hit.
bool march(const Shape& shape, const Ray& ray, double* t) {
  double s = 0;
  for (int i = 0; i < 100000 && s < 100; ++i) {
    const double d = sdf_shape(shape, ray.at(s));
    if (d < 1e-12) {
      *t = s;
      return true;
    }
    s += d;
  }
  return false;
}

TEST(SynthGeometry, HitsLieOnTheSurfaceAndMatchSphereTracing) {
  Rng rng(11, 0);
  int hits = 0, compared = 0;
  for (int i = 0; i < 4000; ++i) {
    Shape s;
    s.kind = static_cast<ShapeKind>(i % 3);
    s.frame = random_frame(rng);
    s.radius = rng.uniform(0.2, 2);
    s.half_extents = {rng.uniform(0.1, 1), rng.uniform(0.1, 1), rng.uniform(0.1, 1)};
    s.major = rng.uniform(0.5, 2), s.minor = s.major * rng.uniform(0.05, 0.6);
    const double scale = bounding_radius(s);
    // Aim near the shape so that many rays hit and some graze.
    const Vec3 origin = s.frame.center + Vec3{rng.normal(), rng.normal(), rng.normal()} * 4 * scale;
    const Vec3 target = s.frame.center + Vec3{rng.normal(), rng.normal(), rng.normal()} * 0.6 * scale;
    if (sdf_shape(s, origin) <= 0) continue;
    const Ray ray = ray_from(origin, target - origin);
    Intersection hit;
    if (!intersect_shape(s, ray, 0, 1e30, &hit)) continue;
    ++hits;
    const Vec3 p = ray.at(hit.t);
    EXPECT_LE(std::abs(sdf_shape(s, p)), 1e-6 * scale) << "shape kind " << i % 3;
    EXPECT_NEAR(length(hit.normal), 1.0, 1e-9);
    EXPECT_LE(dot(hit.normal, ray.direction), 1e-9);  // entering: the normal faces the ray
    double t_ref = 0;
    if (march(s, ray, &t_ref)) {
      ++compared;
      EXPECT_NEAR(hit.t, t_ref, 1e-6 * scale) << "shape kind " << i % 3;
    }
  }
  EXPECT_GT(hits, 1500);
  EXPECT_GT(compared, 1000);
}

TEST(SynthGeometry, PolynomialRootsAreIsolatedExactly) {
  // (x - 1)(x - 2)(x - 3)(x - 4) = x^4 - 10x^3 + 35x^2 - 50x + 24
  const double c1[5] = {24, -50, 35, -10, 1};
  double roots[4];
  ASSERT_EQ(solve_polynomial(c1, 4, -10, 10, roots), 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(roots[i], i + 1.0, 1e-12);
  ASSERT_EQ(solve_polynomial(c1, 4, 1.5, 3.5, roots), 2);
  EXPECT_NEAR(roots[0], 2.0, 1e-12);
  EXPECT_NEAR(roots[1], 3.0, 1e-12);
  // x^4 + 1 has no real root.
  const double c2[5] = {1, 0, 0, 0, 1};
  EXPECT_EQ(solve_polynomial(c2, 4, -10, 10, roots), 0);
  // Close roots: (x - 1)(x - 1.0001)(x + 2)(x - 5), expanded.
  const double a = 1, b = 1.0001, c = -2, d = 5;
  const double c3[5] = {a * b * c * d, -(a * b * c + a * b * d + a * c * d + b * c * d),
                        a * b + a * c + a * d + b * c + b * d + c * d, -(a + b + c + d), 1};
  ASSERT_EQ(solve_polynomial(c3, 4, -10, 10, roots), 4);
  EXPECT_NEAR(roots[0], -2, 1e-10);
  EXPECT_NEAR(roots[1], 1, 1e-8);
  EXPECT_NEAR(roots[2], 1.0001, 1e-8);
  EXPECT_NEAR(roots[3], 5, 1e-10);
}

// ---- Cameras ---------------------------------------------------------------------------------

// A general 4x4 inverse (Gauss-Jordan), independent of the renderer's transpose shortcut.
std::array<double, 16> invert(std::array<double, 16> m) {
  std::array<double, 16> inv{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  for (int c = 0; c < 4; ++c) {
    int pivot = c;
    for (int r = c + 1; r < 4; ++r)
      if (std::abs(m[r * 4 + c]) > std::abs(m[pivot * 4 + c])) pivot = r;
    for (int k = 0; k < 4; ++k) {
      std::swap(m[c * 4 + k], m[pivot * 4 + k]);
      std::swap(inv[c * 4 + k], inv[pivot * 4 + k]);
    }
    const double p = m[c * 4 + c];
    for (int k = 0; k < 4; ++k) m[c * 4 + k] /= p, inv[c * 4 + k] /= p;
    for (int r = 0; r < 4; ++r) {
      if (r == c) continue;
      const double f = m[r * 4 + c];
      for (int k = 0; k < 4; ++k) m[r * 4 + k] -= f * m[c * 4 + k], inv[r * 4 + k] -= f * inv[c * 4 + k];
    }
  }
  return inv;
}

// OpenCV projection: x_cam = world_to_camera * X; u = fx x/z + cx, v = fy y/z + cy.
bool opencv_project(const Camera& camera, const Vec3& p, double* u, double* v) {
  const auto w2c = invert(camera.camera_to_world);
  const double x = w2c[0] * p.x + w2c[1] * p.y + w2c[2] * p.z + w2c[3];
  const double y = w2c[4] * p.x + w2c[5] * p.y + w2c[6] * p.z + w2c[7];
  const double z = w2c[8] * p.x + w2c[9] * p.y + w2c[10] * p.z + w2c[11];
  if (z <= 0) return false;
  *u = camera.fx * x / z + camera.cx;
  *v = camera.fy * y / z + camera.cy;
  return true;
}

TEST(SynthCamera, LookAtFollowsOpenCV) {
  // Looking along +y with +z up: right = +x, down = -z.
  const auto m = look_at({0, -5, 0}, {0, 0, 0});
  const Camera camera = pinhole_camera(64, 48, 50, m);
  expect_near({m[0], m[4], m[8]}, {1, 0, 0}, 1e-12);
  expect_near({m[1], m[5], m[9]}, {0, 0, -1}, 1e-12);
  expect_near({m[2], m[6], m[10]}, {0, 1, 0}, 1e-12);
  EXPECT_DOUBLE_EQ(camera.fx, 32 / std::tan(25 * M_PI / 180));
  EXPECT_DOUBLE_EQ(camera.fy, camera.fx);
  EXPECT_DOUBLE_EQ(camera.cx, 32);
  EXPECT_DOUBLE_EQ(camera.cy, 24);
  // A point up and to the right of the target lands up (small v) and right (large u).
  double u = 0, v = 0;
  ASSERT_TRUE(opencv_project(camera, {1, 0, 1}, &u, &v));
  EXPECT_GT(u, 32);
  EXPECT_LT(v, 24);
  // The renderer's ray through a pixel projects back onto that pixel.
  for (double px : {0.5, 10.25, 63.5})
    for (double py : {0.5, 30.75, 47.5}) {
      ASSERT_TRUE(opencv_project(camera, camera_ray(camera, px, py).at(3.7), &u, &v));
      EXPECT_NEAR(u, px, 1e-9);
      EXPECT_NEAR(v, py, 1e-9);
      ASSERT_TRUE(project(camera, camera_ray(camera, px, py).at(3.7), &u, &v));
      EXPECT_NEAR(u, px, 1e-9);
    }
}

TEST(SynthCamera, SplitRule) {
  EXPECT_EQ(split_of_view(0), Split::Val);
  EXPECT_EQ(split_of_view(4), Split::Test);
  EXPECT_EQ(split_of_view(8), Split::Val);
  EXPECT_EQ(split_of_view(12), Split::Test);
  for (size_t i : {1, 2, 3, 5, 6, 7, 9, 15}) EXPECT_EQ(split_of_view(i), Split::Train) << i;
}

void check_camera_rules(const Camera& c, size_t index, const std::string& preset) {
  const auto& m = c.camera_to_world;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      double d = 0;
      for (int k = 0; k < 3; ++k) d += m[k * 4 + i] * m[k * 4 + j];
      EXPECT_NEAR(d, i == j ? 1.0 : 0.0, 1e-3) << preset << " camera " << index;
    }
  const double det = m[0] * (m[5] * m[10] - m[6] * m[9]) - m[1] * (m[4] * m[10] - m[6] * m[8]) +
                     m[2] * (m[4] * m[9] - m[5] * m[8]);
  EXPECT_NEAR(det, 1.0, 1e-9) << "a rotation, not a reflection";
  EXPECT_EQ(m[12], 0);
  EXPECT_EQ(m[13], 0);
  EXPECT_EQ(m[14], 0);
  EXPECT_EQ(m[15], 1);
  EXPECT_NO_THROW(validate_camera(c, index, "synth:" + preset));
}

TEST(SynthPresets, EveryCameraIsValid) {
  for (const std::string& preset : preset_names()) {
    const SynthScene scene = build_scene({preset, 50, 40, 30, 5});
    ASSERT_EQ(scene.cameras.size(), 50u);
    for (size_t i = 0; i < scene.cameras.size(); ++i) {
      check_camera_rules(scene.cameras[i], i, preset);
      EXPECT_EQ(scene.cameras[i].split, split_of_view(i));
      EXPECT_EQ(scene.cameras[i].width, 40);
      EXPECT_EQ(scene.cameras[i].height, 30);
    }
    EXPECT_EQ(scene.meta.source, "synth:" + preset + " seed=5 views=50 40x30");
    EXPECT_GT(scene.meta.near, 0);
    EXPECT_GT(scene.meta.far, scene.meta.near);
  }
}

TEST(SynthPresets, ObjectsSceneCenterProjectsToImageCenter) {
  for (auto [w, h] : {std::pair{64, 64}, std::pair{80, 45}, std::pair{30, 90}}) {
    const SynthScene scene = build_scene({"objects", 40, w, h, 2});
    const auto& b = scene.meta.scene_bounds;
    const Vec3 center{0.5 * (b[0] + b[3]), 0.5 * (b[1] + b[4]), 0.5 * (b[2] + b[5])};
    for (size_t i = 0; i < scene.cameras.size(); ++i) {
      double u = 0, v = 0;
      ASSERT_TRUE(opencv_project(scene.cameras[i], center, &u, &v));
      EXPECT_NEAR(u, 0.5 * w, 1e-6) << "camera " << i;
      EXPECT_NEAR(v, 0.5 * h, 1e-6) << "camera " << i;
      // Upper hemisphere: every camera is above the center (world z up).
      EXPECT_GT(scene.cameras[i].camera_to_world[11], center.z);
    }
  }
}

TEST(SynthPresets, ObjectSurfacePointsProjectOntoCoveredPixels) {
  const SynthScene scene = build_scene({"objects", 16, 96, 72, 4});
  int checked = 0;
  for (size_t i = 0; i < scene.cameras.size(); ++i) {
    const Camera& camera = scene.cameras[i];
    const RenderedView view = render_view(scene, i);
    const Vec3 eye{camera.camera_to_world[3], camera.camera_to_world[7],
                   camera.camera_to_world[11]};
    for (const Shape& s : scene.shapes) {
      if (s.kind != ShapeKind::Sphere) continue;
      // The sphere point nearest the camera: on the surface, and seen unless something is in
      // front of it, which is an object too. Either way the pixel is not background.
      const Vec3 p = s.frame.center + normalize(eye - s.frame.center) * s.radius;
      ASSERT_NEAR(sdf_shape(s, p), 0, 1e-12);
      double u = 0, v = 0;
      ASSERT_TRUE(opencv_project(camera, p, &u, &v));
      ASSERT_TRUE(u >= 0 && u < camera.width && v >= 0 && v < camera.height) << u << " " << v;
      const auto x = static_cast<int64_t>(u), y = static_cast<int64_t>(v);
      EXPECT_EQ(view.alpha[y][x].item<uint8_t>(), 255) << "camera " << i << " pixel " << x << "," << y;
      const auto rgb = view.rgb[y][x];
      EXPECT_FALSE(rgb[0].item<uint8_t>() == 255 && rgb[1].item<uint8_t>() == 255 &&
                   rgb[2].item<uint8_t>() == 255);
      ++checked;
    }
    // Image corners of the objects preset show the background.
    EXPECT_EQ(view.alpha[0][0].item<uint8_t>(), 0);
    EXPECT_EQ(view.rgb[0][0][0].item<uint8_t>(), 255);
  }
  EXPECT_GE(checked, 16 * 2);
}

TEST(SynthPresets, ObjectsHaveAntialiasedEdgesAndShading) {
  const SynthScene scene = build_scene({"objects", 8, 64, 64, 0});
  const RenderedView view = render_view(scene, 1);
  const auto a = view.alpha.to(torch::kInt32);
  EXPECT_GT(((a > 0) & (a < 255)).sum().item<int64_t>(), 0) << "no partial coverage on edges";
  EXPECT_GT((a == 255).sum().item<int64_t>(), 64) << "objects too small";
  EXPECT_GT((a == 0).sum().item<int64_t>(), 64) << "no background";
  // Many distinct colors: textures and shading vary over the surfaces.
  const auto rgb = view.rgb.reshape({-1, 3}).to(torch::kInt64);
  const auto keys = rgb.select(1, 0) * 65536 + rgb.select(1, 1) * 256 + rgb.select(1, 2);
  EXPECT_GT(std::get<0>(at::_unique(keys)).numel(), 100);
}

TEST(SynthPresets, RoomEnclosesTheCameras) {
  const SynthScene scene = build_scene({"room", 24, 32, 24, 9});
  EXPECT_FALSE(scene.with_alpha);
  const auto& b = scene.meta.scene_bounds;
  std::set<int> shapes_seen;
  for (size_t i = 0; i < scene.cameras.size(); ++i) {
    const Camera& camera = scene.cameras[i];
    const Vec3 eye{camera.camera_to_world[3], camera.camera_to_world[7],
                   camera.camera_to_world[11]};
    EXPECT_TRUE(eye.x > b[0] && eye.x < b[3] && eye.y > b[1] && eye.y < b[4] && eye.z > b[2] &&
                eye.z < b[5]);
    for (const Shape& s : scene.shapes) EXPECT_GT(sdf_shape(s, eye), 0.1);
    // Every ray hits something, within [near, far] both as distance and as depth.
    for (int v = 0; v < camera.height; v += 3)
      for (int u = 0; u < camera.width; u += 3) {
        const Ray ray = camera_ray(camera, u + 0.5, v + 0.5);
        const SurfaceHit hit = trace(scene, ray);
        ASSERT_GE(hit.shape, 0) << "camera " << i << " pixel " << u << "," << v;
        shapes_seen.insert(hit.shape);
        const double depth = dot(ray.direction, Vec3{camera.camera_to_world[2],
                                                     camera.camera_to_world[6],
                                                     camera.camera_to_world[10]}) * hit.t;
        EXPECT_GE(depth, scene.meta.near);
        EXPECT_LE(hit.t, scene.meta.far);
      }
  }
  // Floor, ceiling and the four walls (shapes 0-5) all appear, and furniture too.
  for (int s = 0; s < 6; ++s) EXPECT_EQ(shapes_seen.count(s), 1u) << "room shape " << s;
  EXPECT_GE(shapes_seen.size(), 6u + 4u);
  const RenderedView view = render_view(scene, 3);
  EXPECT_FALSE(view.alpha.defined());
}

TEST(SynthPresets, ObjectRaysStayWithinNearFarAndBounds) {
  const SynthScene scene = build_scene({"objects", 12, 40, 40, 1});
  const auto& b = scene.meta.scene_bounds;
  for (const Camera& camera : scene.cameras)
    for (int v = 0; v < camera.height; ++v)
      for (int u = 0; u < camera.width; ++u) {
        const SurfaceHit hit = trace(scene, camera_ray(camera, u + 0.5, v + 0.5));
        if (hit.shape < 0) continue;
        EXPECT_GE(hit.t, scene.meta.near);
        EXPECT_LE(hit.t, scene.meta.far);
        const Vec3& p = hit.point;
        EXPECT_TRUE(p.x > b[0] && p.x < b[3] && p.y > b[1] && p.y < b[4] && p.z > b[2] &&
                    p.z < b[5]);
      }
}

TEST(SynthPresets, DeterministicFromTheSeed) {
  for (const std::string& preset : preset_names()) {
    const SynthScene a = build_scene({preset, 10, 40, 32, 21});
    const SynthScene b = build_scene({preset, 10, 40, 32, 21});
    const SynthScene c = build_scene({preset, 10, 40, 32, 22});
    for (size_t i : {0, 5, 9}) {
      EXPECT_EQ(a.cameras[i].camera_to_world, b.cameras[i].camera_to_world);
      const RenderedView va = render_view(a, i), vb = render_view(b, i), vc = render_view(c, i);
      EXPECT_TRUE(torch::equal(va.rgb, vb.rgb)) << preset << " view " << i;
      EXPECT_FALSE(torch::equal(va.rgb, vc.rgb)) << preset << " view " << i;
    }
    // The scene's content does not depend on the number of views or the image size.
    const SynthScene d = build_scene({preset, 30, 64, 64, 21});
    ASSERT_EQ(d.shapes.size(), a.shapes.size());
    for (size_t k = 0; k < a.shapes.size(); ++k)
      expect_near(d.shapes[k].frame.center, a.shapes[k].frame.center, 0);
    const SurfacePoints pa = sample_surface_points(a, 500), pb = sample_surface_points(b, 500);
    EXPECT_TRUE(torch::equal(pa.xyz, pb.xyz));
    EXPECT_TRUE(torch::equal(pa.rgb, pb.rgb));
  }
}

// A summary of where a scene's shapes are and how they turn: each center and rotation entry,
// weighted by position so that swapped draws change it.
double placement_signature(const SynthScene& scene) {
  double sum = 0, weight = 1;
  for (const Shape& shape : scene.shapes) {
    for (const double v : {shape.frame.center.x, shape.frame.center.y, shape.frame.center.z})
      sum += (weight += 1) * v;
    for (const double v : shape.frame.rotation) sum += (weight += 1) * v;
  }
  return sum;
}

TEST(SynthPresets, SameSceneUnderEveryCompiler) {
  // The same seed must give the same scene whatever compiled Tessera: gcc and clang once placed
  // and turned the shapes differently (the draws were arguments of one call, whose order each
  // compiler picks). These values were printed by the gcc 12 build and match the clang 14 build
  // (launch/test --sanitize); they change only with a deliberate change to the presets.
  // Hexadecimal: the exact doubles; the tolerance leaves room for another libm only.
  const double want_objects = 0x1.9c22a09b4100bp+9, want_room = 0x1.a422f269f52b1p+12;
  const double objects = placement_signature(build_scene({"objects", 8, 32, 24, 0}));
  const double room = placement_signature(build_scene({"room", 8, 32, 24, 0}));
  std::printf("placement signatures: objects %a, room %a\n", objects, room);
  EXPECT_NEAR(objects, want_objects, 1e-9 * std::abs(want_objects));
  EXPECT_NEAR(room, want_room, 1e-9 * std::abs(want_room));
}

TEST(SynthPresets, RendersAreIndependentOfTheThreadCount) {
  const SynthScene scene = build_scene({"objects", 4, 64, 48, 8});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const RenderedView serial = render_view(scene, 2);
  at::set_num_threads(std::max(2, threads));
  const RenderedView parallel = render_view(scene, 2);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(serial.rgb, parallel.rgb));
  EXPECT_TRUE(torch::equal(serial.alpha, parallel.alpha));
}

TEST(SynthPresets, SurfacePointsLieNearVisibleSurfaces) {
  for (const std::string& preset : preset_names()) {
    const SynthScene scene = build_scene({preset, 20, 48, 48, 3});
    const SurfacePoints points = sample_surface_points(scene, 1000);
    ASSERT_EQ(points.xyz.size(0), 1000);
    ASSERT_EQ(points.xyz.scalar_type(), torch::kFloat32);
    ASSERT_EQ(points.rgb.scalar_type(), torch::kUInt8);
    const auto& b = scene.meta.scene_bounds;
    const double diagonal = length(Vec3{b[3] - b[0], b[4] - b[1], b[5] - b[2]});
    const auto xyz = points.xyz.to(torch::kFloat64).contiguous();
    const double* p = xyz.data_ptr<double>();
    for (int64_t i = 0; i < 1000; ++i) {
      const Vec3 q{p[3 * i], p[3 * i + 1], p[3 * i + 2]};
      double d = 1e30;
      for (const Shape& s : scene.shapes) d = std::min(d, std::abs(sdf_shape(s, q)));
      EXPECT_LT(d, 0.02 * diagonal) << preset << " point " << i;  // noise sigma is 0.002 diag
    }
    const auto rgb = points.rgb.to(torch::kInt32);
    EXPECT_GT((rgb - rgb[0]).abs().sum().item<int64_t>(), 0) << "all point colors equal";
  }
}

TEST(SynthOptions, BadInputIsAUserError) {
  try {
    build_scene({"nope", 10, 32, 32, 0});
    FAIL() << "unknown preset accepted";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("nope"), std::string::npos);
    EXPECT_NE(what.find("objects"), std::string::npos);
    EXPECT_NE(what.find("room"), std::string::npos);
  }
  EXPECT_THROW(validate_options({"objects", 2, 32, 32, 0}), UserError);
  EXPECT_THROW(validate_options({"objects", 10, 7, 32, 0}), UserError);
  EXPECT_THROW(validate_options({"objects", 10, 32, 8193, 0}), UserError);
  EXPECT_NO_THROW(validate_options({"room", 3, 8, 8192, 0}));
}

// ---- End to end ------------------------------------------------------------------------------

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tessera_synth_" + std::to_string(getpid()) + "_" + name))
      .string();
}

TEST(SynthEndToEnd, TheSameOptionsWriteTheSameBytes) {
  // No object times in the file (h5::create_with): two writes a second apart are identical,
  // seal included.
  const std::string a = temp_path("bytes_a.h5"), b = temp_path("bytes_b.h5");
  write_synth_scene({"objects", 8, 32, 24, 3}, a);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  write_synth_scene({"objects", 8, 32, 24, 3}, b);
  const std::string bytes_a = test::read_file(a), bytes_b = test::read_file(b);
  EXPECT_GT(bytes_a.size(), 1000u);
  EXPECT_TRUE(bytes_a == bytes_b) << "two writes of one scene differ";
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

TEST(SynthEndToEnd, WritesADatasetTheReaderAccepts) {
  for (const std::string& preset : preset_names()) {
    const std::string path = temp_path(preset + ".h5");
    size_t last_done = 0, calls = 0;
    const SynthSummary summary =
        write_synth_scene({preset, 20, 40, 30, 6}, path, [&](size_t done, size_t total) {
          EXPECT_EQ(total, 20u);
          EXPECT_EQ(done, last_done + 1);
          last_done = done, ++calls;
        });
    EXPECT_EQ(calls, 20u);
    EXPECT_EQ(summary.views_per_split[0], 15u);  // 1-3, 5-7, 9-11, 13-15, 17-19
    EXPECT_EQ(summary.views_per_split[1], 3u);   // 0, 8, 16
    EXPECT_EQ(summary.views_per_split[2], 2u);   // 4, 12
    EXPECT_EQ(summary.points, kSurfacePoints);
    EXPECT_EQ(summary.file_bytes, std::filesystem::file_size(path));

    SceneReader reader(path);
    EXPECT_EQ(reader.cameras().size(), 20u);
    EXPECT_EQ(reader.indices(Split::Train).size(), 15u);
    EXPECT_EQ(reader.indices(Split::Val), (std::vector<size_t>{0, 8, 16}));
    EXPECT_EQ(reader.indices(Split::Test), (std::vector<size_t>{4, 12}));
    EXPECT_EQ(reader.meta().source, "synth:" + preset + " seed=6 views=20 40x30");
    EXPECT_EQ(reader.has_alpha(), preset == "objects");
    const SynthScene scene = build_scene({preset, 20, 40, 30, 6});
    for (size_t i : {0, 7, 19}) {
      const torch::Tensor rgb = reader.read_image(i);
      EXPECT_EQ(rgb.sizes(), (std::vector<int64_t>{30, 40, 3}));
      const RenderedView view = render_view(scene, i);
      EXPECT_TRUE(torch::equal(rgb, view.rgb)) << preset << " view " << i;
      if (reader.has_alpha()) {
        EXPECT_TRUE(torch::equal(reader.read_alpha(i), view.alpha));
      }
      const auto& stored = reader.cameras()[i].camera_to_world;
      const auto& world = scene.cameras[i].camera_to_world;
      if (!scene.as_capture) {
        EXPECT_EQ(stored, world);
        continue;
      }
      // A capture-like preset is written normalized: the same rotation, the position mapped by
      // the recorded transform (world = capture_scale * synth + capture_offset).
      const double scale = reader.meta().capture_scale;
      const auto& offset = reader.meta().capture_offset;
      for (int row = 0; row < 3; ++row) {
        for (int col = 0; col < 3; ++col)
          EXPECT_EQ(stored[row * 4 + col], world[row * 4 + col]) << preset << " view " << i;
        EXPECT_NEAR(stored[row * 4 + 3], scale * world[row * 4 + 3] + offset[row], 1e-12);
      }
    }
    ASSERT_TRUE(reader.has_points());
    const torch::Tensor xyz = reader.read_points_xyz(), prgb = reader.read_points_rgb();
    EXPECT_EQ(xyz.size(0), kSurfacePoints);
    const auto colors = prgb.to(torch::kInt32);
    EXPECT_GT((colors - colors[0]).abs().sum().item<int64_t>(), 0);
    if (!scene.as_capture) {
      EXPECT_EQ(reader.meta().near, scene.meta.near);
      EXPECT_EQ(reader.meta().far, scene.meta.far);
    }
    EXPECT_EQ(reader.meta().unbounded(), scene.as_capture) << preset;
    test::remove_tree(path);
  }
}

// Runs the `tessera` binary with `args`; returns the exit code and fills `err` with stderr.
int run_tessera(const std::string& args, std::string* err) {
  const char* binary = std::getenv("TESSERA_BINARY");
  if (!binary) return -1;
  const std::string err_path = temp_path("stderr.txt");
  const std::string command = std::string(binary) + " " + args + " >/dev/null 2>" + err_path;
  const int status = std::system(command.c_str());
  *err = test::read_file(err_path);
  test::remove_tree(err_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(SynthPresets, TabletopIsTheObjectsSceneOnATableUnderADome) {
  const SynthScene objects = build_scene({"objects", 16, 32, 24, 4});
  const SynthScene scene = build_scene({"tabletop", 16, 32, 24, 4});
  EXPECT_FALSE(scene.with_alpha);
  EXPECT_TRUE(scene.as_capture);
  EXPECT_FALSE(objects.as_capture);
  // The same objects (then the table and the dome) and the same cameras as `objects`.
  ASSERT_EQ(scene.shapes.size(), objects.shapes.size() + 2);
  for (size_t i = 0; i < objects.shapes.size(); ++i) {
    EXPECT_EQ(scene.shapes[i].frame.center.x, objects.shapes[i].frame.center.x);
    EXPECT_EQ(scene.shapes[i].texture.color_a.y, objects.shapes[i].texture.color_a.y);
  }
  ASSERT_EQ(scene.cameras.size(), objects.cameras.size());
  for (size_t i = 0; i < scene.cameras.size(); ++i)
    EXPECT_EQ(scene.cameras[i].camera_to_world, objects.cameras[i].camera_to_world);
  // Every ray ends on a surface, as in a photo; objects, table and dome are all seen.
  std::set<int> shapes_seen;
  const int table = static_cast<int>(objects.shapes.size()), dome = table + 1;
  for (size_t i = 0; i < scene.cameras.size(); ++i) {
    const Camera& camera = scene.cameras[i];
    for (const Shape& s : scene.shapes) EXPECT_GT(std::abs(sdf_shape(s, {camera.camera_to_world[3],
        camera.camera_to_world[7], camera.camera_to_world[11]})), 0.1) << "camera " << i;
    for (int v = 0; v < camera.height; v += 2)
      for (int u = 0; u < camera.width; u += 2) {
        const SurfaceHit hit = trace(scene, camera_ray(camera, u + 0.5, v + 0.5));
        ASSERT_GE(hit.shape, 0) << "camera " << i << " pixel " << u << "," << v;
        shapes_seen.insert(hit.shape);
      }
  }
  EXPECT_EQ(shapes_seen.count(table), 1u);
  EXPECT_EQ(shapes_seen.count(dome), 1u);
  EXPECT_GE(shapes_seen.size(), 2u + 4u);

  // Written as an imported capture: cameras at the import's canonical median distance (2.6) from
  // the origin, the foreground box [-1, 1]^3 holding the objects, an extent beyond it holding the
  // dome's points, and the near plane close to the cameras.
  const std::string path = temp_path("tabletop.h5");
  write_synth_scene({"tabletop", 16, 32, 24, 4}, path);
  SceneReader reader(path);
  const SceneMeta& meta = reader.meta();
  EXPECT_TRUE(meta.unbounded());
  EXPECT_EQ(meta.scene_bounds, (std::array<double, 6>{-1, -1, -1, 1, 1, 1}));
  std::vector<double> distances;
  for (const Camera& camera : reader.cameras()) {
    const auto& m = camera.camera_to_world;
    distances.push_back(std::sqrt(m[3] * m[3] + m[7] * m[7] + m[11] * m[11]));
  }
  std::sort(distances.begin(), distances.end());
  EXPECT_NEAR(distances[distances.size() / 2], 2.6, 1e-9);
  EXPECT_LT(meta.near, 0.1);
  const auto& b = objects.meta.scene_bounds;
  for (int corner = 0; corner < 8; ++corner) {
    const double world[3] = {b[(corner & 1) ? 3 : 0], b[(corner & 2) ? 4 : 1], b[(corner & 4) ? 5 : 2]};
    for (int a = 0; a < 3; ++a)
      EXPECT_LE(std::abs(meta.capture_scale * world[a] + meta.capture_offset[a]), 1.0) << corner;
  }
  const torch::Tensor xyz = reader.read_points_xyz();
  const double reach = xyz.abs().max().item<double>();
  EXPECT_GT(reach, 4.0);  // the dome, kDomeRadius camera distances out
  EXPECT_LE(reach, meta.scene_extent[3]);
  test::remove_tree(path);
}

TEST(SynthEndToEnd, BinaryWritesAFileAndRejectsUnknownPresets) {
  if (!std::getenv("TESSERA_BINARY")) GTEST_SKIP() << "TESSERA_BINARY not set (run under CTest)";
  const std::string out = temp_path("cli.h5");
  std::string err;
  EXPECT_EQ(run_tessera("synth --preset objects --out " + out +
                            " --views 12 --width 32 --height 24",
                        &err),
            0)
      << err;
  EXPECT_TRUE(std::filesystem::exists(out));
  EXPECT_NE(err.find("12/12 views"), std::string::npos) << err;
  test::remove_tree(out);

  EXPECT_EQ(run_tessera("synth --preset nope --out " + out, &err), 2);
  EXPECT_NE(err.find("objects"), std::string::npos) << err;
  EXPECT_NE(err.find("room"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_EQ(run_tessera("synth --preset objects --views 2 --out " + out, &err), 2);
  EXPECT_NE(err.find("--views"), std::string::npos) << err;
  EXPECT_EQ(run_tessera("synth --preset objects --width 9000 --out " + out, &err), 2);
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(SynthEndToEnd, BinaryWritesShapesAndRefusesFlagsOfTheOtherKind) {
  if (!std::getenv("TESSERA_BINARY")) GTEST_SKIP() << "TESSERA_BINARY not set (run under CTest)";
  const std::string out = temp_path("shapes_cli.h5");
  std::string err;
  ASSERT_EQ(run_tessera("synth --preset shapes --count 20 --points 32 --seed 4 --out " + out, &err),
            0)
      << err;
  EXPECT_NE(err.find("20/20 shapes"), std::string::npos) << err;
  const shapes::ShapesReader reader(out);
  EXPECT_EQ(reader.count(), 20);
  EXPECT_EQ(reader.points_per_shape(), 32);
  EXPECT_EQ(reader.source(), "synth:shapes count=20 points=32 seed=4");
  test::remove_tree(out);
  EXPECT_EQ(run_tessera("synth --preset shapes --views 12 --out " + out, &err), 2);
  EXPECT_NE(err.find("--views: scene flags; --preset shapes takes --count"), std::string::npos)
      << err;
  EXPECT_EQ(run_tessera("synth --preset objects --points 12 --out " + out, &err), 2);
  EXPECT_NE(err.find("--points: flags of --preset shapes"), std::string::npos) << err;
  EXPECT_EQ(run_tessera("synth --preset shapes --count 5 --out " + out, &err), 2);
  EXPECT_NE(err.find("--count 5 is out of range"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace tessera::data::synth
