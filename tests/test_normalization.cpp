// Tests of the import's scene normalization (docs/datasets.md, "Scene normalization"): the
// center, scale, bounds and extent it picks, instant-ngp's keys, the recorded transform, and the
// round trips back to the capture's coordinates (projections, nerfstudio export, PLY).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "distributed/errors.h"
#include "framework/data/image_io.h"
#include "framework/data/import.h"
#include "framework/data/scene.h"
#include "models/gaussians/gaussian_params.h"
#include "models/gaussians/ply.h"
#include "tests/pose_fixtures.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace data = tessera::data;
namespace gs = tessera::models::gaussians;
using data::Camera;
using data::Matrix4;
using nlohmann::json;
using tessera::test::matrix_json;
using tessera::test::Pixel;
using tessera::test::project;
using tessera::test::sub;
using tessera::test::Vec3;

// A temporary folder for these tests.
struct TempDir : tessera::test::TempDir {
  TempDir() : tessera::test::TempDir("tessera_norm") {}
};

// OpenGL look-at with world +z up (the captures below orbit about z).
Matrix4 look_at_gl(const Vec3& eye, const Vec3& target) {
  return tessera::test::look_at_gl(eye, target, {0, 0, 1});
}

constexpr int kW = 16, kH = 12;           // fixture image size
constexpr double kFocal = 14.0;           // fixture focal length (pixels)
constexpr double kTight = 1e-9;           // doubles through JSON and one affine map
constexpr double kPixelTolerance = 1e-7;  // the same point projected through two routes


double norm(const Vec3& a) { return std::sqrt(a[0] * a[0] + a[1] * a[1] + a[2] * a[2]); }

// A transforms.json capture of `poses` (OpenGL) with kW x kH images; `extra` keys at the top.
void write_capture(const std::string& dir, const std::vector<Matrix4>& poses, const json& extra = {}) {
  fs::create_directories(dir + "/images");
  json frames = json::array();
  for (size_t i = 0; i < poses.size(); ++i) {
    const std::string name = "images/f_" + std::to_string(100 + i) + ".png";
    auto rgb = torch::full({kH, kW, 3}, static_cast<int>(20 + 10 * i), torch::kUInt8);
    data::write_png(dir + "/" + name, rgb);
    frames.push_back({{"file_path", name}, {"transform_matrix", matrix_json(poses[i])}});
  }
  json meta = {{"fl_x", kFocal}, {"fl_y", kFocal}, {"cx", kW / 2.0}, {"cy", kH / 2.0},
               {"w", kW}, {"h", kH}, {"frames", frames}};
  for (auto it = extra.begin(); it != extra.end(); ++it) meta[it.key()] = it.value();
  std::ofstream(dir + "/transforms.json") << meta.dump(2);
}

// Cameras on a tilted ring of `radius` around `center`, all looking at it.
std::vector<Matrix4> ring_around(const Vec3& center, double radius, int count) {
  std::vector<Matrix4> poses;
  for (int i = 0; i < count; ++i) {
    const double a = 2 * M_PI * i / count;
    const Vec3 eye = {center[0] + radius * std::cos(a), center[1] + radius * std::sin(a),
                      center[2] + 0.3 * radius + 0.05 * radius * i};
    poses.push_back(look_at_gl(eye, center));
  }
  return poses;
}

Vec3 to_world(const data::SceneMeta& meta, const Vec3& x) {
  return {meta.capture_scale * x[0] + meta.capture_offset[0],
          meta.capture_scale * x[1] + meta.capture_offset[1],
          meta.capture_scale * x[2] + meta.capture_offset[2]};
}

Vec3 center_of(const Camera& c) {
  return {c.camera_to_world[3], c.camera_to_world[7], c.camera_to_world[11]};
}

}  // namespace

TEST(Normalization, ObjectCaptureIsCenteredOnWhatTheCamerasLookAtAndScaled) {
  TempDir tmp;
  const Vec3 object = {5.0, -3.0, 2.0};
  const double radius = 10.0;
  const auto poses = ring_around(object, radius, 9);
  write_capture(tmp / "cap", poses);
  const auto scene = data::read_source(tmp / "cap");
  const data::SceneMeta& meta = scene.meta;
  // Every camera is at distance sqrt(1 + 0.3^2 + ...) * radius; their median maps to 2.6.
  std::vector<double> d;
  for (const auto& p : poses) d.push_back(norm(sub({p[3], p[7], p[11]}, object)));
  std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
  EXPECT_NEAR(meta.capture_scale, 2.6 / d[d.size() / 2], kTight);
  // The object (where every optical axis points) lands at the origin.
  const Vec3 o = to_world(meta, object);
  for (int a = 0; a < 3; ++a) EXPECT_NEAR(o[a], 0.0, 1e-9) << "axis " << a;
  EXPECT_EQ(meta.scene_bounds, (std::array<double, 6>{-1, -1, -1, 1, 1, 1}));
  EXPECT_EQ(meta.scene_extent, (std::array<double, 6>{-16, -16, -16, 16, 16, 16}));
  EXPECT_TRUE(meta.unbounded());
  EXPECT_GT(meta.far, 16.0);
  double mean_distance = 0;  // of the normalized cameras from the origin
  for (const Camera& c : scene.cameras) mean_distance += norm(center_of(c)) / scene.cameras.size();
  EXPECT_NEAR(meta.near, 0.02 * mean_distance, kTight);
  // Round trip of the geometry: a point seen by the capture camera at pixel (u, v) is seen by
  // the normalized camera at the same pixel once mapped into the world.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> jitter(-1.5, 1.5);
  for (size_t i = 0; i < poses.size(); ++i) {
    Camera capture = scene.cameras[i];
    for (int r = 0; r < 3; ++r) capture.camera_to_world[r * 4 + 3] = poses[i][r * 4 + 3];
    for (int k = 0; k < 5; ++k) {
      const Vec3 X = {object[0] + jitter(rng), object[1] + jitter(rng), object[2] + jitter(rng)};
      const Pixel want = project(capture, X), got = project(scene.cameras[i], to_world(meta, X));
      EXPECT_NEAR(got.u, want.u, kPixelTolerance) << "camera " << i;
      EXPECT_NEAR(got.v, want.v, kPixelTolerance) << "camera " << i;
      EXPECT_NEAR(got.depth, meta.capture_scale * want.depth, kPixelTolerance) << "camera " << i;
    }
  }
}

TEST(Normalization, ForwardFacingCaptureFallsBackToTheMeanCameraCenter) {
  TempDir tmp;
  // Parallel optical axes (all looking along -y from a line of cameras): no point to converge on.
  std::vector<Matrix4> poses;
  for (int i = 0; i < 6; ++i)
    poses.push_back(look_at_gl({1.0 + i, 4.0, 0.5}, {1.0 + i, -10.0, 0.5}));
  write_capture(tmp / "ff", poses);
  const auto scene = data::read_source(tmp / "ff");
  const Vec3 mean = {3.5, 4.0, 0.5};
  const Vec3 o = to_world(scene.meta, mean);
  for (int a = 0; a < 3; ++a) EXPECT_NEAR(o[a], 0.0, 1e-9) << "axis " << a;
  EXPECT_TRUE(scene.meta.unbounded());
}

// Forward-facing with SfM points (LLFF's fern, a COLMAP phone capture): a short baseline before a
// deep scene. The center is the points' median, not the cameras', so that what the cameras look
// at lands in the foreground box instead of far out in contracted space.
TEST(Normalization, ForwardFacingCaptureWithPointsCentersOnThem) {
  TempDir tmp;
  std::vector<Matrix4> poses;  // a 1-unit baseline, looking along -y at content 20 units away
  for (int i = 0; i < 6; ++i)
    poses.push_back(look_at_gl({0.2 * i, 4.0, 0.5}, {0.2 * i, -10.0, 0.5}));
  const Vec3 content = {0.5, -16.0, 0.5};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> spread(-2.0f, 2.0f);
  torch::Tensor xyz = torch::empty({200, 3});
  for (int64_t k = 0; k < xyz.size(0); ++k)
    for (int a = 0; a < 3; ++a) xyz[k][a] = static_cast<float>(content[a]) + spread(rng);
  xyz[0] = torch::tensor({0.5f, -400.0f, 0.5f});  // a stray point of the far background
  fs::create_directories(tmp / "ff");
  data::write_ply_points(tmp / "ff/points.ply", xyz, torch::full({200, 3}, 128, torch::kUInt8));
  write_capture(tmp / "ff", poses, {{"ply_file_path", "points.ply"}});
  const auto scene = data::read_source(tmp / "ff");
  const torch::Tensor median = std::get<0>(xyz.to(torch::kFloat64).median(0));
  const Vec3 center = to_world(scene.meta, {median[0].item<double>(), median[1].item<double>(),
                                            median[2].item<double>()});
  for (int a = 0; a < 3; ++a) EXPECT_NEAR(center[a], 0.0, 1e-6) << "axis " << a;
  // The cameras at the canonical 2.6 from it, the content within the foreground box.
  std::vector<double> d;
  for (const Camera& c : scene.cameras) d.push_back(norm(center_of(c)));
  std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
  EXPECT_NEAR(d[d.size() / 2], 2.6, 1e-6);
  const Vec3 middle = to_world(scene.meta, content);
  for (int a = 0; a < 3; ++a) EXPECT_LT(std::abs(middle[a]), 0.5) << "axis " << a;
  EXPECT_TRUE(scene.meta.unbounded());
}

TEST(Normalization, InstantNgpScaleOffsetAndAabbScaleKeepTheirMeaning) {
  TempDir tmp;
  const auto poses = ring_around({0, 0, 0}, 4.0, 5);
  write_capture(tmp / "ngp", poses,
                {{"aabb_scale", 4}, {"scale", 0.5}, {"offset", {0.5, 0.25, 0.5}}});
  const auto scene = data::read_source(tmp / "ngp");
  // instant-ngp's unit cube (x * 0.5 + offset in [0, 1]) is the foreground [-1, 1]^3.
  EXPECT_DOUBLE_EQ(scene.meta.capture_scale, 1.0);
  EXPECT_DOUBLE_EQ(scene.meta.capture_offset[0], 0.0);
  EXPECT_DOUBLE_EQ(scene.meta.capture_offset[1], -0.5);
  EXPECT_DOUBLE_EQ(scene.meta.capture_offset[2], 0.0);
  EXPECT_EQ(scene.meta.scene_bounds, (std::array<double, 6>{-1, -1, -1, 1, 1, 1}));
  EXPECT_EQ(scene.meta.scene_extent, (std::array<double, 6>{-4, -4, -4, 4, 4, 4}));
  // The default scale 0.33: the fox's convention, cameras 4 units out land 2.64 out.
  write_capture(tmp / "fox", poses, {{"aabb_scale", 1}});
  const auto fox = data::read_source(tmp / "fox");
  EXPECT_DOUBLE_EQ(fox.meta.capture_scale, 0.66);
  EXPECT_FALSE(fox.meta.unbounded()) << "aabb_scale 1: nothing outside the unit cube";
  EXPECT_NEAR(norm(center_of(fox.cameras[0])), 0.66 * norm({poses[0][3], poses[0][7], poses[0][11]}),
              kTight);
}

TEST(Normalization, KeepCoordinatesGivesTheSameBoxesInCaptureUnits) {
  TempDir tmp;
  const auto poses = ring_around({1, 2, 3}, 8.0, 7);
  write_capture(tmp / "cap", poses);
  const auto normalized = data::read_source(tmp / "cap");
  data::ImportOptions keep;
  keep.normalize = false;
  const auto kept = data::read_source(tmp / "cap", keep);
  EXPECT_EQ(kept.meta.capture_scale, 1.0);
  EXPECT_EQ(kept.meta.capture_offset, (std::array<double, 3>{0, 0, 0}));
  const double s = normalized.meta.capture_scale;
  for (int i = 0; i < 6; ++i) {
    const double o = normalized.meta.capture_offset[i % 3];
    EXPECT_NEAR(kept.meta.scene_bounds[i], (normalized.meta.scene_bounds[i] - o) / s, 1e-9);
    EXPECT_NEAR(kept.meta.scene_extent[i], (normalized.meta.scene_extent[i] - o) / s, 1e-9);
  }
  EXPECT_NEAR(kept.meta.far, normalized.meta.far / s, 1e-9);
  for (size_t i = 0; i < poses.size(); ++i)
    for (int r = 0; r < 3; ++r)
      EXPECT_DOUBLE_EQ(kept.cameras[i].camera_to_world[r * 4 + 3], poses[i][r * 4 + 3]);
  EXPECT_NE(kept.meta.source.find("keep-coordinates"), std::string::npos) << kept.meta.source;
}

TEST(Normalization, RecordedInTheFileAndExportsGoBackToTheCapture) {
  TempDir tmp;
  const auto poses = ring_around({-2, 7, 1}, 6.0, 8);
  write_capture(tmp / "cap", poses);
  const auto scene = data::read_source(tmp / "cap");
  const std::string h5 = tmp / "cap.h5";
  data::write_scene(scene, h5);
  {
    const data::SceneReader reader(h5);
    EXPECT_EQ(reader.meta().capture_scale, scene.meta.capture_scale);
    EXPECT_EQ(reader.meta().capture_offset, scene.meta.capture_offset);
    EXPECT_EQ(reader.meta().scene_extent, scene.meta.scene_extent);
    EXPECT_TRUE(reader.meta().unbounded());
  }
  // nerfstudio export: the capture's own poses again (OpenGL), within JSON's 17 digits.
  data::export_nerfstudio(h5, tmp / "ns");
  json out;
  std::ifstream(tmp / "ns/transforms.json") >> out;
  ASSERT_EQ(out["frames"].size(), poses.size());
  for (size_t i = 0; i < poses.size(); ++i)
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c)
        EXPECT_NEAR(out["frames"][i]["transform_matrix"][r][c].get<double>(), poses[i][r * 4 + c],
                    kTight)
            << "frame " << i << " [" << r << "][" << c << "]";
  // PLY frames: capture -> world -> capture is the identity on means and scales.
  gs::GaussianParams p = gs::init_from_points(
      torch::tensor({0.1f, 0.2f, 0.3f, -1.0f, 2.0f, 0.5f, 0.4f, -0.3f, 0.9f, 1.0f, 1.0f, 1.0f})
          .view({4, 3}),
      torch::full({4, 3}, 128, torch::kUInt8), {-1, -1, -1, 1, 1, 1}, {});
  const gs::GaussianParams world =
      gs::capture_to_world(p, scene.meta.capture_scale, scene.meta.capture_offset);
  EXPECT_NEAR((world.means[1][0].item<double>() - scene.meta.capture_offset[0]) /
                  scene.meta.capture_scale,
              -1.0, 1e-6);
  EXPECT_NEAR((world.scales() / p.scales()).max().item<double>(), scene.meta.capture_scale, 1e-5);
  const gs::GaussianParams back =
      gs::world_to_capture(world, scene.meta.capture_scale, scene.meta.capture_offset);
  EXPECT_TRUE(torch::allclose(back.means, p.means, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(back.log_scales, p.log_scales, 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(back.quats, p.quats));
  EXPECT_TRUE(torch::equal(back.sh_dc, p.sh_dc));
}

TEST(Normalization, FilesWithoutTheAttributesReadAsBoundedAndUnscaled) {
  TempDir tmp;
  data::SceneMeta meta;
  meta.scene_bounds = {-1, -1, -1, 1, 1, 1};
  meta.near = 0.5;
  meta.far = 5;
  meta.source = "test";
  Camera c;
  c.fx = c.fy = kFocal;
  c.cx = kW / 2.0;
  c.cy = kH / 2.0;
  c.width = kW;
  c.height = kH;
  c.camera_to_world[11] = -3;
  {
    data::SceneWriter writer(tmp / "s.h5", meta, {c}, false);  // extent unset: the bounds
    writer.write_image(0, torch::zeros({kH, kW, 3}, torch::kUInt8));
    writer.commit();
  }
  const data::SceneReader reader(tmp / "s.h5");
  EXPECT_EQ(reader.meta().scene_extent, meta.scene_bounds);
  EXPECT_FALSE(reader.meta().unbounded());
  EXPECT_EQ(reader.meta().capture_scale, 1.0);
  // An extent that does not contain the bounds is refused.
  meta.scene_extent = {-0.5, -1, -1, 1, 1, 1};
  EXPECT_THROW(data::SceneWriter(tmp / "t.h5", meta, {c}, false), tessera::UserError);
}
