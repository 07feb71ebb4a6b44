// Tests of `tessera convert`: image I/O, pose conventions, the Blender, nerfstudio/instant-ngp and
// COLMAP importers on fixtures written here, bad input, downscaling, and the nerfstudio export.
#include <gtest/gtest.h>
#include <stb/stb_image_write.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <random>

#include "distributed/errors.h"
#include "framework/data/image_io.h"
#include "framework/data/import.h"
#include "tests/import_fixtures.h"
#include "tests/pose_fixtures.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace data = tessera::data;
using data::Camera;
using data::Matrix4;
using data::Split;
using nlohmann::json;
using tessera::test::look_at_gl;
using tessera::test::matrix_json;
using tessera::test::Pixel;
using tessera::test::project;
using tessera::test::TempDir;
using tessera::test::Vec3;
using tessera::test::cross;
using tessera::test::normalize;
using tessera::test::sub;
using tessera::test::axis_angle_quaternion;
using tessera::test::ColmapFixture;
using tessera::test::colmap_fixture;
using tessera::test::pattern;
using tessera::test::write_colmap_binary;
using tessera::test::write_colmap_text;
using tessera::test::write_json;
using tessera::test::write_png_in;
using tessera::test::write_rgba;
using tessera::test::write_text;

constexpr int kW = tessera::test::kFixtureWidth, kH = tessera::test::kFixtureHeight;
constexpr double kAngleX = 0.8;            // Blender camera_angle_x (radians)
constexpr double kPoseTolerance = 1e-9;    // doubles through JSON / COLMAP text round-trip exactly
constexpr double kPixelTolerance = 1e-7;   // projections of the same point through two routes

// ---- Small geometry ------------------------------------------------------------------------------

// The same point through an OpenGL camera (looks down -z, y up): an independent route.
Pixel project_gl(const Matrix4& m, double fx, double fy, double cx, double cy, const Vec3& X) {
  const Vec3 d = {X[0] - m[3], X[1] - m[7], X[2] - m[11]};
  double p[3];
  for (int j = 0; j < 3; ++j) p[j] = m[j] * d[0] + m[4 + j] * d[1] + m[8 + j] * d[2];
  return {cx + fx * p[0] / -p[2], cy - fy * p[1] / -p[2], -p[2]};
}

// Rotates v by the unit quaternion q (w x y z) as q * (0, v) * conj(q): COLMAP's world-to-camera
// rotation, computed without a rotation matrix.
Vec3 rotate(const std::array<double, 4>& q, const Vec3& v) {
  const double w = q[0], x = q[1], y = q[2], z = q[3];
  // t = q * (0, v)
  const double tw = -x * v[0] - y * v[1] - z * v[2];
  const double tx = w * v[0] + y * v[2] - z * v[1];
  const double ty = w * v[1] + z * v[0] - x * v[2];
  const double tz = w * v[2] + x * v[1] - y * v[0];
  // t * conj(q)
  return {-tw * x + tx * w - ty * z + tz * y, -tw * y + ty * w - tz * x + tx * z,
          -tw * z + tz * w - tx * y + ty * x};
}


// ---- Fixtures ------------------------------------------------------------------------------------

// Cameras on a ring around the origin, looking at it; OpenGL camera-to-world.
std::vector<Matrix4> ring_poses(int count, double radius = 4.0) {
  std::vector<Matrix4> poses;
  for (int i = 0; i < count; ++i) {
    const double a = 2 * M_PI * i / count;
    poses.push_back(look_at_gl({radius * std::cos(a), 0.7 + 0.1 * i, radius * std::sin(a)}, {0, 0, 0}));
  }
  return poses;
}

// A NeRF-synthetic folder: train/val/test with 3/2/1 RGBA frames of kW x kH.
std::vector<Matrix4> write_blender(const std::string& dir, const std::vector<int>& counts = {3, 2, 1},
                                   std::vector<Matrix4> poses = {}) {
  const char* names[] = {"train", "val", "test"};
  if (poses.empty()) poses = ring_poses(counts[0] + counts[1] + counts[2]);
  int n = 0;
  for (int s = 0; s < 3; ++s) {
    if (counts[s] == 0) continue;
    json frames = json::array();
    for (int i = 0; i < counts[s]; ++i, ++n) {
      const std::string stem = std::string(names[s]) + "/r_" + std::to_string(i);
      write_rgba((fs::path(dir) / (stem + ".png")).string(), kW, kH, n);
      frames.push_back({{"file_path", "./" + stem}, {"rotation", 0.1}, {"transform_matrix", matrix_json(poses[n])}});
    }
    write_json((fs::path(dir) / ("transforms_" + std::string(names[s]) + ".json")).string(),
               {{"camera_angle_x", kAngleX}, {"frames", frames}});
  }
  return poses;
}


// Expects `action` to throw a UserError whose message contains every one of `needles`.
void expect_user_error(const std::function<void()>& action, const std::vector<std::string>& needles) {
  try {
    action();
    ADD_FAILURE() << "no UserError thrown (expected one naming " << needles[0] << ")";
  } catch (const tessera::UserError& e) {
    for (const auto& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// A whole conversion that must fail naming `needles`, leaving the output folder empty.
void expect_convert_fails(const TempDir& tmp, const std::string& input,
                          const std::vector<std::string>& needles, data::ImportOptions options = {}) {
  const std::string out_dir = tmp / "out";
  fs::create_directories(out_dir);
  const std::string out = out_dir + "/scene.h5";
  expect_user_error([&] { data::write_scene(data::read_source(input, options), out); }, needles);
  EXPECT_FALSE(fs::exists(out)) << out;
  EXPECT_TRUE(fs::is_empty(out_dir)) << "something was left in " << out_dir;
}

// Options that keep the fixture's own coordinates, so that its known points apply as they are
// (the pose-convention tests; the normalization has tests of its own in test_normalization).
data::ImportOptions keep_coordinates(data::ImportOptions options = {}) {
  options.normalize = false;
  return options;
}

std::array<double, 8> intrinsics_of(const Camera& c) {
  return {c.fx, c.fy, c.cx, c.cy, c.k1, c.k2, c.p1, c.p2};
}

void expect_same_cameras(const std::vector<Camera>& a, const std::vector<Camera>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("camera " + std::to_string(i));
    EXPECT_EQ(a[i].width, b[i].width);
    EXPECT_EQ(a[i].height, b[i].height);
    EXPECT_EQ(a[i].split, b[i].split);
    const double sa[] = {a[i].fx, a[i].fy, a[i].cx, a[i].cy, a[i].k1, a[i].k2, a[i].p1, a[i].p2};
    const double sb[] = {b[i].fx, b[i].fy, b[i].cx, b[i].cy, b[i].k1, b[i].k2, b[i].p1, b[i].p2};
    for (int k = 0; k < 8; ++k) EXPECT_NEAR(sa[k], sb[k], tol) << "intrinsic " << k;
    for (int k = 0; k < 16; ++k) EXPECT_NEAR(a[i].camera_to_world[k], b[i].camera_to_world[k], tol) << "pose " << k;
  }
}

}  // namespace

// ---- Image I/O -----------------------------------------------------------------------------------

TEST(ImageIo, PngRoundTripKeepsRgbAndAlpha) {
  TempDir tmp;
  const auto rgba = pattern(kW, kH, 5, 4);
  write_png_in(tmp / "a.png", rgba.slice(2, 0, 3).contiguous(), rgba.select(2, 3).contiguous());
  const auto back = data::read_image_file(tmp / "a.png");
  EXPECT_EQ(back.rgb.sizes().vec(), (std::vector<int64_t>{kH, kW, 3}));
  EXPECT_TRUE(torch::equal(back.rgb, rgba.slice(2, 0, 3)));
  ASSERT_TRUE(back.alpha.defined());
  EXPECT_TRUE(torch::equal(back.alpha, rgba.select(2, 3)));

  write_png_in(tmp / "b.png", pattern(kW, kH, 6));
  const auto rgb = data::read_image_file(tmp / "b.png");
  EXPECT_FALSE(rgb.alpha.defined());
  EXPECT_TRUE(torch::equal(rgb.rgb, pattern(kW, kH, 6)));
}

// PNG, 16-bit PNG and .npy go through PATH.partial: whole files or none, and no partial left.
TEST(ImageIo, WritersLeaveWholeFilesOrNone) {
  TempDir tmp;
  const auto rgb = pattern(kW, kH, 6);
  const torch::Tensor values = torch::rand({kH, kW});
  data::write_png(tmp / "a.png", rgb);
  data::write_png16(tmp / "a16.png", values, 1.0, {});
  data::write_npy(tmp / "a.npy", values);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.str())) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.npy", "a.png", "a16.png"}));
  EXPECT_TRUE(torch::equal(data::read_image_file(tmp / "a.png").rgb, rgb));
  // A missing folder: UserError, nothing made.
  EXPECT_THROW(data::write_png(tmp / "missing/b.png", rgb), tessera::UserError);
  EXPECT_THROW(data::write_npy(tmp / "missing/b.npy", values), tessera::UserError);
  EXPECT_THROW(data::write_png16(tmp / "missing/b.png", values, 1.0, {}), tessera::UserError);
  EXPECT_FALSE(std::filesystem::exists(tmp / "missing"));
  // The rename fails (a folder in the way): UserError, the partial removed, the folder kept.
  std::filesystem::create_directories(tmp / "taken.png/inside");
  EXPECT_THROW(data::write_png(tmp / "taken.png", rgb), tessera::UserError);
  EXPECT_THROW(data::write_npy(tmp / "taken.png", values), tessera::UserError);
  EXPECT_FALSE(std::filesystem::exists(tmp / "taken.png.partial"));
  EXPECT_TRUE(std::filesystem::is_directory(tmp / "taken.png/inside"));
}

TEST(ImageIo, ReadsJpegAndGreyscalePng) {
  TempDir tmp;
  auto smooth = torch::empty({kH, kW, 3}, torch::kUInt8);
  for (int y = 0; y < kH; ++y)
    for (int x = 0; x < kW; ++x)
      for (int c = 0; c < 3; ++c) smooth[y][x][c] = 60 + 4 * x + 3 * y + 20 * c;
  const std::string jpg = tmp / "a.jpg";
  ASSERT_TRUE(stbi_write_jpg(jpg.c_str(), kW, kH, 3, smooth.data_ptr<uint8_t>(), 100));
  const auto image = data::read_image_file(jpg);
  EXPECT_EQ(image.rgb.sizes().vec(), (std::vector<int64_t>{kH, kW, 3}));
  EXPECT_FALSE(image.alpha.defined());
  EXPECT_LT((image.rgb.to(torch::kFloat) - smooth.to(torch::kFloat)).abs().max().item<float>(), 8.0f);

  const auto grey = pattern(kW, kH, 2, 1);
  const std::string png = tmp / "g.png";
  ASSERT_TRUE(stbi_write_png(png.c_str(), kW, kH, 1, grey.data_ptr<uint8_t>(), kW));
  const auto g = data::read_image_file(png);
  for (int c = 0; c < 3; ++c) EXPECT_TRUE(torch::equal(g.rgb.select(2, c), grey.select(2, 0)));
}

TEST(ImageIo, DownscaleIsTheRoundedBoxMean) {
  torch::manual_seed(1);
  for (int k : {1, 2, 3}) {
    for (bool planar : {false, true}) {
      const auto image = planar ? torch::randint(0, 256, {13, 10}, torch::kUInt8)
                                : torch::randint(0, 256, {13, 10, 3}, torch::kUInt8);
      const auto out = data::downscale(image, k);
      const int64_t h = 13 / k, w = 10 / k, channels = planar ? 1 : 3;
      ASSERT_EQ(out.size(0), h);
      ASSERT_EQ(out.size(1), w);
      ASSERT_EQ(out.dim(), image.dim());
      const auto in = image.reshape({13, 10, channels});
      const auto got = out.reshape({h, w, channels});
      int wrong = 0;
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          for (int64_t c = 0; c < channels; ++c) {
            int sum = 0;
            for (int dy = 0; dy < k; ++dy)
              for (int dx = 0; dx < k; ++dx) sum += in[y * k + dy][x * k + dx][c].item<int>();
            wrong += got[y][x][c].item<int>() != (sum + k * k / 2) / (k * k);
          }
      EXPECT_EQ(wrong, 0) << "k=" << k << " planar=" << planar;
    }
  }
  EXPECT_THROW(data::downscale(torch::zeros({3, 3, 3}, torch::kUInt8), 4), std::invalid_argument);
}

TEST(ImageIo, MissingOrCorruptImageNamesTheFile) {
  TempDir tmp;
  expect_user_error([&] { data::read_image_file(tmp / "none.png"); }, {tmp / "none.png"});
  write_text(tmp / "bad.png", "this is not a png");
  expect_user_error([&] { data::read_image_file(tmp / "bad.png"); }, {tmp / "bad.png"});
  expect_user_error([&] { data::probe_image(tmp / "bad.png"); }, {tmp / "bad.png"});
  // A name the OS refuses (found by the colmap fuzz target: a name of 300 bytes made
  // std::filesystem throw, exit 1) is an image that does not exist, with the OS's reason.
  const std::string too_long = tmp / (std::string(300, 'a') + ".png");
  expect_user_error([&] { data::probe_image(too_long); }, {too_long, "does not exist ("});
}

// ---- Point clouds (PLY) ------------------------------------------------------------------------

TEST(PlyPoints, RoundTripsBinaryAndReadsAscii) {
  TempDir tmp;
  const auto xyz = torch::tensor({0.5, -1.0, 2.0, 3.0, 4.0, -5.25}, torch::kFloat64).reshape({2, 3});
  const auto rgb = torch::tensor({1, 2, 3, 250, 251, 252}, torch::kUInt8).reshape({2, 3});
  data::write_ply_points(tmp / "p.ply", xyz, rgb);
  const auto [xyz_read, rgb_read] = data::read_ply_points(tmp / "p.ply");
  EXPECT_TRUE(torch::equal(xyz_read, xyz));
  EXPECT_TRUE(torch::equal(rgb_read, rgb));
  // The tightest ASCII file there is: one digit per value, no newline after the last vertex.
  write_text(tmp / "a.ply", "ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\n"
                            "property float y\nproperty float z\nend_header\n1 2 3\n4 5 6");
  const auto [a_xyz, a_rgb] = data::read_ply_points(tmp / "a.ply");
  EXPECT_TRUE(torch::equal(a_xyz, torch::tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, torch::kFloat64).reshape({2, 3})));
  EXPECT_TRUE(torch::equal(a_rgb, torch::full({2, 3}, 255, torch::kUInt8))) << "no colour: white";
}

// A vertex count past what the file holds (found by the ply fuzz target: 2^63 - 1 vertices asked
// torch for an impossible allocation), one that is not a number, and a header without its end
// are UserErrors naming the file, before anything is allocated.
TEST(PlyPoints, RefusesCountsTheFileCannotHold) {
  TempDir tmp;
  const std::string header = "ply\nformat binary_little_endian 1.0\nelement vertex ";
  const std::string properties = "\nproperty float x\nproperty float y\nproperty float z\nend_header\n";
  write_text(tmp / "huge.ply", header + "9223372036854775807" + properties + std::string(24, '\0'));
  expect_user_error([&] { data::read_ply_points(tmp / "huge.ply"); },
                    {tmp / "huge.ply", "declares 9223372036854775807 vertices", "hold at most 2"});
  write_text(tmp / "short.ply", header + "3" + properties + std::string(24, '\0'));
  expect_user_error([&] { data::read_ply_points(tmp / "short.ply"); }, {tmp / "short.ply", "at most 2"});
  write_text(tmp / "word.ply", header + "many" + properties);
  expect_user_error([&] { data::read_ply_points(tmp / "word.ply"); }, {tmp / "word.ply", "vertex count"});
  write_text(tmp / "open.ply", header + "1\nproperty float x\n");
  expect_user_error([&] { data::read_ply_points(tmp / "open.ply"); }, {tmp / "open.ply", "end_header"});
}

// ---- Pose conventions ----------------------------------------------------------------------------

TEST(Poses, OpenGlToOpenCvFlipsTheCameraYAndZAxes) {
  const Matrix4 gl = look_at_gl({1, 2, 3}, {0, 0.5, 0});
  const Matrix4 cv = data::opengl_to_opencv(gl);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(cv[r * 4 + 0], gl[r * 4 + 0]);
    EXPECT_EQ(cv[r * 4 + 1], -gl[r * 4 + 1]);
    EXPECT_EQ(cv[r * 4 + 2], -gl[r * 4 + 2]);
    EXPECT_EQ(cv[r * 4 + 3], gl[r * 4 + 3]);
  }
  EXPECT_EQ(data::opencv_to_opengl(cv), gl);
}

TEST(Poses, ColmapWorldToCameraIsInverted) {
  // Identity rotation, t = (0, 0, 5): the camera sits at (0, 0, -5) and looks along +z.
  Matrix4 c2w = data::colmap_to_camera_to_world({1, 0, 0, 0}, {0, 0, 5});
  const Matrix4 expected{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, -5, 0, 0, 0, 1};
  EXPECT_EQ(c2w, expected);
  // Any quaternion (normalized on the way): x_cam = R X + t must equal R_c2w^T (X - C).
  const std::array<double, 4> q = axis_angle_quaternion({0.2, -1, 0.5}, 2.1);
  const Vec3 t = {0.3, -1.2, 2.5}, X = {0.7, -0.4, 1.9};
  c2w = data::colmap_to_camera_to_world({2 * q[0], 2 * q[1], 2 * q[2], 2 * q[3]}, t);
  const Vec3 rotated = rotate(q, X);
  Camera camera;
  camera.fx = camera.fy = 1;
  camera.camera_to_world = c2w;
  const Pixel p = project(camera, X);
  const double z = rotated[2] + t[2];
  EXPECT_NEAR(p.depth, z, 1e-12);
  EXPECT_NEAR(p.u, (rotated[0] + t[0]) / z, 1e-12);
  EXPECT_NEAR(p.v, (rotated[1] + t[1]) / z, 1e-12);
  EXPECT_THROW(data::colmap_to_camera_to_world({0, 0, 0, 0}, t), std::invalid_argument);
  EXPECT_THROW(data::colmap_to_camera_to_world({NAN, 0, 0, 0}, t), std::invalid_argument);
}

// Every fixture point projects through the imported OpenCV cameras where the OpenGL fixture says.
void expect_gl_projections(const std::vector<Camera>& cameras, const std::vector<Matrix4>& poses) {
  ASSERT_EQ(cameras.size(), poses.size());
  const std::vector<Vec3> points = {{0, 0, 0}, {0.3, 0.2, -0.1}, {-0.4, 0.5, 0.3}, {0.1, -0.6, 0.2}};
  for (size_t i = 0; i < cameras.size(); ++i)
    for (const Vec3& X : points) {
      const Camera& c = cameras[i];
      const Pixel want = project_gl(poses[i], c.fx, c.fy, c.cx, c.cy, X);
      const Pixel got = project(c, X);
      EXPECT_GT(got.depth, 0) << "camera " << i << ": the point must be in front (z > 0)";
      EXPECT_NEAR(got.u, want.u, kPixelTolerance) << "camera " << i;
      EXPECT_NEAR(got.v, want.v, kPixelTolerance) << "camera " << i;
      EXPECT_NEAR(got.depth, want.depth, kPixelTolerance) << "camera " << i;
    }
}

// Camera 0 looks down -z (OpenGL) from (0, 0, 5): the origin is dead ahead, world up is image up.
void expect_straight_ahead(const Camera& c) {
  const Pixel center = project(c, {0, 0, 0});
  EXPECT_NEAR(center.u, c.cx, 1e-12);
  EXPECT_NEAR(center.v, c.cy, 1e-12);
  EXPECT_NEAR(center.depth, 5, 1e-12);
  const Pixel up = project(c, {0, 1, 0});
  EXPECT_NEAR(up.u, c.cx, 1e-12);
  EXPECT_LT(up.v, c.cy) << "a point up in the world must land above the center (smaller v)";
  EXPECT_NEAR(up.v, c.cy - c.fy / 5, 1e-12);
  const Pixel right = project(c, {1, 0, 0});
  EXPECT_NEAR(right.u, c.cx + c.fx / 5, 1e-12);
}

// ---- Blender / NeRF-synthetic --------------------------------------------------------------------

TEST(Blender, ReadsSplitsIntrinsicsAlphaAndImages) {
  TempDir tmp;
  const std::string dir = tmp / "lego";
  write_blender(dir);
  EXPECT_EQ(data::detect_format(dir), data::SourceFormat::Blender);
  const data::ImportedScene scene = data::read_source(dir);
  ASSERT_EQ(scene.cameras.size(), 6u);
  const Split splits[] = {Split::Train, Split::Train, Split::Train, Split::Val, Split::Val, Split::Test};
  const char* files[] = {"train/r_0.png", "train/r_1.png", "train/r_2.png", "val/r_0.png", "val/r_1.png", "test/r_0.png"};
  const double f = 0.5 * kW / std::tan(kAngleX / 2);
  for (size_t i = 0; i < 6; ++i) {
    const Camera& c = scene.cameras[i];
    EXPECT_EQ(c.split, splits[i]) << i;
    EXPECT_EQ(c.width, kW);
    EXPECT_EQ(c.height, kH);
    EXPECT_DOUBLE_EQ(c.fx, f);
    EXPECT_DOUBLE_EQ(c.fy, f);
    EXPECT_EQ(c.cx, kW / 2.0);
    EXPECT_EQ(c.cy, kH / 2.0);
    EXPECT_EQ(c.k1 + c.k2 + c.p1 + c.p2, 0);
    EXPECT_EQ(scene.image_paths[i], (fs::path(dir) / files[i]).string());
  }
  EXPECT_TRUE(scene.has_alpha);
  EXPECT_EQ(scene.meta.scene_bounds, (std::array<double, 6>{-1.5, -1.5, -1.5, 1.5, 1.5, 1.5}));
  EXPECT_EQ(scene.meta.near, 2);
  EXPECT_EQ(scene.meta.far, 6);
  EXPECT_EQ(scene.meta.background, (std::array<double, 3>{1, 1, 1}));
  EXPECT_EQ(scene.meta.source.rfind("blender:", 0), 0u) << scene.meta.source;

  const std::string out = tmp / "lego.h5";
  data::write_scene(scene, out);
  const data::SceneReader reader(out);
  expect_same_cameras(reader.cameras(), scene.cameras, 0);
  ASSERT_TRUE(reader.has_alpha());
  EXPECT_FALSE(reader.has_points());
  for (size_t i = 0; i < 6; ++i) {
    const auto rgba = pattern(kW, kH, static_cast<int>(i), 4);
    EXPECT_TRUE(torch::equal(reader.read_image(i), rgba.slice(2, 0, 3))) << i;
    EXPECT_TRUE(torch::equal(reader.read_alpha(i), rgba.select(2, 3))) << i;
  }
}

TEST(Blender, PosesProjectKnownPointsLikeOpenGl) {
  TempDir tmp;
  std::vector<Matrix4> poses = ring_poses(4, 3.5);
  poses[0] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 5, 0, 0, 0, 1};  // at (0, 0, 5), looking down -z
  write_blender(tmp / "scene", {3, 1, 0}, poses);
  const auto scene = data::read_source(tmp / "scene");
  expect_straight_ahead(scene.cameras[0]);
  expect_gl_projections(scene.cameras, poses);
}

// ---- nerfstudio / instant-ngp --------------------------------------------------------------------

TEST(Transforms, NerfstudioIntrinsicsOverridesDistortionAndEveryNthSplit) {
  TempDir tmp;
  const std::string dir = tmp / "ns";
  std::vector<Matrix4> poses = ring_poses(7);
  poses[0] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 5, 0, 0, 0, 1};
  json frames = json::array();
  for (int i = 6; i >= 0; --i) {  // listed in reverse: the importer sorts by file name
    const std::string name = "images/frame_0000" + std::to_string(i) + ".png";
    const int scale = i == 2 ? 2 : 1;
    write_png_in((fs::path(dir) / name).string(), pattern(kW * scale, kH * scale, i));
    json frame = {{"file_path", name}, {"transform_matrix", matrix_json(poses[i])}};
    if (i == 2) frame.update({{"fl_x", 30.0}, {"fl_y", 31.0}, {"cx", 16.5}, {"cy", 11.5}, {"w", 32}, {"h", 24}, {"p1", 0.003}});
    frames.push_back(frame);
  }
  write_json(dir + "/transforms.json", {{"camera_model", "OPENCV"}, {"fl_x", 14.0}, {"fl_y", 15.0},
                                        {"cx", 8.25}, {"cy", 5.75}, {"w", kW}, {"h", kH},
                                        {"k1", 0.1}, {"k2", -0.05}, {"frames", frames}});
  EXPECT_EQ(data::detect_format(dir), data::SourceFormat::Transforms);
  data::ImportOptions options = keep_coordinates();
  options.split_every = 3;
  const auto scene = data::read_source(dir, options);
  ASSERT_EQ(scene.cameras.size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    SCOPED_TRACE(i);
    const Camera& c = scene.cameras[i];
    EXPECT_EQ(scene.image_paths[i], dir + "/images/frame_0000" + std::to_string(i) + ".png");
    EXPECT_EQ(c.split, i % 3 == 0 ? Split::Val : Split::Train);
    const bool over = i == 2;
    EXPECT_EQ(c.fx, over ? 30.0 : 14.0);
    EXPECT_EQ(c.fy, over ? 31.0 : 15.0);
    EXPECT_EQ(c.cx, over ? 16.5 : 8.25);
    EXPECT_EQ(c.cy, over ? 11.5 : 5.75);
    EXPECT_EQ(c.width, over ? 32 : kW);
    EXPECT_EQ(c.height, over ? 24 : kH);
    EXPECT_EQ(c.k1, 0.1);
    EXPECT_EQ(c.k2, -0.05);
    EXPECT_EQ(c.p1, over ? 0.003 : 0.0);
    EXPECT_EQ(c.p2, 0.0);
  }
  expect_straight_ahead(scene.cameras[0]);
  expect_gl_projections(scene.cameras, poses);
  EXPECT_FALSE(scene.has_alpha);
  EXPECT_EQ(scene.meta.source.rfind("nerfstudio:", 0), 0u) << scene.meta.source;
  // No points and no aabb_scale: an unbounded capture whose extent holds every camera.
  EXPECT_TRUE(scene.meta.unbounded());
  for (const Camera& c : scene.cameras)
    for (int a = 0; a < 3; ++a) {
      EXPECT_GT(c.camera_to_world[a * 4 + 3], scene.meta.scene_extent[a]);
      EXPECT_LT(c.camera_to_world[a * 4 + 3], scene.meta.scene_extent[a + 3]);
    }
  EXPECT_GT(scene.meta.near, 0);
  EXPECT_GT(scene.meta.far, scene.meta.near);
  // The file itself works as INPUT too.
  expect_same_cameras(data::read_source(dir + "/transforms.json", options).cameras, scene.cameras, 0);
}

TEST(Transforms, InstantNgpCameraAngleSizeFromImageAndAabbScale) {
  TempDir tmp;
  const std::string dir = tmp / "ngp";
  const std::vector<Matrix4> poses = ring_poses(3);
  json frames = json::array();
  for (int i = 0; i < 3; ++i) {
    const std::string name = "images_2/f_" + std::to_string(i) + ".jpg";
    const auto rgb = pattern(kW, kH, i);
    fs::create_directories(dir + "/images_2");
    ASSERT_TRUE(stbi_write_jpg((dir + "/" + name).c_str(), kW, kH, 3, rgb.data_ptr<uint8_t>(), 90));
    frames.push_back({{"file_path", (i == 1 ? "./" : "") + name}, {"transform_matrix", matrix_json(poses[i])}});
  }
  write_json(dir + "/transforms.json", {{"camera_angle_x", 0.9}, {"aabb_scale", 4}, {"frames", frames}});
  const auto scene = data::read_source(dir, keep_coordinates());
  ASSERT_EQ(scene.cameras.size(), 3u);
  const double f = 0.5 * kW / std::tan(0.45);
  for (const Camera& c : scene.cameras) {
    EXPECT_DOUBLE_EQ(c.fx, f);
    EXPECT_DOUBLE_EQ(c.fy, f);
    EXPECT_EQ(c.cx, 8);
    EXPECT_EQ(c.cy, 6);
    EXPECT_EQ(c.width, kW);
    EXPECT_EQ(c.height, kH);
  }
  // instant-ngp's meaning, in the file's units: its unit cube (x * 0.33 + 0.5 in [0, 1]) is the
  // foreground, aabb_scale times it the extent.
  for (int a = 0; a < 3; ++a) {
    EXPECT_DOUBLE_EQ(scene.meta.scene_bounds[a], -0.5 / 0.33);
    EXPECT_DOUBLE_EQ(scene.meta.scene_bounds[a + 3], 0.5 / 0.33);
    EXPECT_DOUBLE_EQ(scene.meta.scene_extent[a], -2.0 / 0.33);
    EXPECT_DOUBLE_EQ(scene.meta.scene_extent[a + 3], 2.0 / 0.33);
  }
  EXPECT_NE(scene.meta.source.find("instant-ngp:"), std::string::npos) << scene.meta.source;
  EXPECT_NE(scene.meta.source.find("aabb_scale=4"), std::string::npos) << scene.meta.source;
  expect_gl_projections(scene.cameras, poses);
}

TEST(Transforms, SplitListsInTheFileAreUsed) {
  TempDir tmp;
  const std::string dir = tmp / "lists";
  const std::vector<Matrix4> poses = ring_poses(5);
  json frames = json::array();
  for (int i = 0; i < 5; ++i) {
    const std::string name = std::string(1, char('a' + i)) + ".png";
    write_png_in(dir + "/" + name, pattern(kW, kH, i));
    frames.push_back({{"file_path", name}, {"transform_matrix", matrix_json(poses[i])}});
  }
  json meta = {{"fl_x", 14.0}, {"fl_y", 14.0}, {"cx", 8.0}, {"cy", 6.0}, {"w", kW}, {"h", kH},
               {"frames", frames}, {"train_filenames", {"a.png", "c.png", "e.png"}},
               {"val_filenames", {"./b.png"}}, {"test_filenames", {"d.png"}}};
  write_json(dir + "/transforms.json", meta);
  const auto scene = data::read_source(dir);
  const Split want[] = {Split::Train, Split::Val, Split::Train, Split::Test, Split::Train};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(scene.cameras[i].split, want[i]) << i;
  meta["test_filenames"] = json::array();
  write_json(dir + "/transforms.json", meta);
  expect_user_error([&] { data::read_source(dir); }, {dir + "/transforms.json", "d.png", "none of"});
}

TEST(Splits, EveryEighthIsValByDefault) {
  std::vector<Camera> cameras(17);
  data::assign_interval_splits(cameras, data::kDefaultSplitEvery);
  for (size_t i = 0; i < cameras.size(); ++i)
    EXPECT_EQ(cameras[i].split, i == 0 || i == 8 || i == 16 ? Split::Val : Split::Train) << i;
  std::vector<Camera> one(1);
  data::assign_interval_splits(one, 8);
  EXPECT_EQ(one[0].split, Split::Train) << "a lone camera must stay trainable";
}

// ---- COLMAP --------------------------------------------------------------------------------------

TEST(Colmap, TextAndBinaryGiveIdenticalScenes) {
  TempDir tmp;
  const std::string text_root = tmp / "text", bin_root = tmp / "bin";
  const ColmapFixture f = colmap_fixture(text_root);
  write_colmap_text(text_root + "/sparse/0", f);
  write_colmap_binary(bin_root + "/sparse", f);
  EXPECT_EQ(data::detect_format(text_root), data::SourceFormat::Colmap);
  EXPECT_EQ(data::detect_format(bin_root), data::SourceFormat::Colmap);
  const auto text = data::read_source(text_root);
  data::ImportOptions options;
  options.images_dir = text_root + "/images";
  const auto binary = data::read_source(bin_root, options);
  EXPECT_NE(text.meta.source.find("colmap-text:"), std::string::npos);
  EXPECT_NE(binary.meta.source.find("colmap-binary:"), std::string::npos);
  expect_same_cameras(text.cameras, binary.cameras, 0);
  EXPECT_EQ(text.image_paths, binary.image_paths);
  EXPECT_TRUE(torch::equal(text.points_xyz, binary.points_xyz));
  EXPECT_TRUE(torch::equal(text.points_rgb, binary.points_rgb));
  EXPECT_EQ(text.meta.scene_bounds, binary.meta.scene_bounds);
  EXPECT_EQ(text.meta.capture_scale, binary.meta.capture_scale);
  EXPECT_EQ(text.meta.capture_offset, binary.meta.capture_offset);

  // Sorted by name; d.jpg uses the second (PINHOLE, 32x12) camera; default split: index 0 is val.
  const std::vector<std::string> names = {"a.png", "c.png", "d.jpg", "e.png", "sub/b.png"};
  ASSERT_EQ(text.cameras.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(text.image_paths[i], text_root + "/images/" + names[i]);
    EXPECT_EQ(text.cameras[i].split, i == 0 ? Split::Val : Split::Train);
    EXPECT_EQ(text.cameras[i].width, names[i] == "d.jpg" ? 2 * kW : kW);
  }
  const Camera& d = text.cameras[2];
  EXPECT_EQ(intrinsics_of(d), (std::array<double, 8>{20, 21, 16, 6, 0, 0, 0, 0}));
  const Camera& a = text.cameras[0];
  EXPECT_EQ(intrinsics_of(a), (std::array<double, 8>{14, 15, 8.5, 5.5, 0.01, -0.02, 0.001, 0.002}));
  // Points: all 301 kept, normalized with the cameras; the extent holds the bulk of them and
  // ignores the stray one (a box 1000 units out would waste the whole contracted grid).
  ASSERT_EQ(text.points_xyz.size(0), 301);
  EXPECT_EQ(text.points_rgb[5][1].item<int>(), 10);
  const double s = text.meta.capture_scale;
  for (int k : {0, 17, 300})
    for (int a = 0; a < 3; ++a)
      EXPECT_NEAR(text.points_xyz[k][a].item<float>(), s * f.points[k].xyz[a] + text.meta.capture_offset[a],
                  1e-6 * (1 + std::abs(s * f.points[k].xyz[a])));
  EXPECT_TRUE(text.meta.unbounded());
  EXPECT_EQ(text.meta.scene_extent, (std::array<double, 6>{-16, -16, -16, 16, 16, 16}));
  EXPECT_EQ(text.meta.scene_bounds, (std::array<double, 6>{-1, -1, -1, 1, 1, 1}));
  EXPECT_GT(text.meta.near, 0);
  EXPECT_GT(text.meta.far, 16.0);
}

TEST(Colmap, AllFiveCameraModels) {
  struct Case {
    std::string model;
    std::vector<double> params;
    std::array<double, 8> want;  // fx fy cx cy k1 k2 p1 p2
  };
  const Case cases[] = {
      {"SIMPLE_PINHOLE", {13, 8.25, 6.25}, {13, 13, 8.25, 6.25, 0, 0, 0, 0}},
      {"PINHOLE", {13, 14, 8.25, 6.25}, {13, 14, 8.25, 6.25, 0, 0, 0, 0}},
      {"SIMPLE_RADIAL", {13, 8.25, 6.25, 0.05}, {13, 13, 8.25, 6.25, 0.05, 0, 0, 0}},
      {"RADIAL", {13, 8.25, 6.25, 0.05, -0.01}, {13, 13, 8.25, 6.25, 0.05, -0.01, 0, 0}},
      {"OPENCV", {13, 14, 8.25, 6.25, 0.05, -0.01, 0.002, -0.003}, {13, 14, 8.25, 6.25, 0.05, -0.01, 0.002, -0.003}},
  };
  TempDir tmp;
  for (const Case& c : cases) {
    for (bool binary : {false, true}) {
      SCOPED_TRACE(c.model + (binary ? " binary" : " text"));
      const std::string root = tmp / (c.model + (binary ? "_bin" : "_txt"));
      const ColmapFixture f = colmap_fixture(root, c.model, c.params);
      binary ? write_colmap_binary(root, f) : write_colmap_text(root, f);
      const auto scene = data::read_source(root);
      const Camera& a = scene.cameras[0];  // a.png, camera 1
      EXPECT_EQ(intrinsics_of(a), c.want);
    }
  }
}

TEST(Colmap, PosesProjectLikeColmap) {
  TempDir tmp;
  const std::string root = tmp / "poses";
  ColmapFixture f = colmap_fixture(root);
  f.images[1].q = {1, 0, 0, 0};  // a.png: identity rotation, t = (0, 0, 5)
  f.images[1].t = {0, 0, 5};
  write_colmap_binary(root + "/sparse/0", f);
  const auto scene = data::read_source(root, keep_coordinates());
  // a.png: the world origin is 5 ahead, on the principal point; world +y is image down.
  const Camera& a = scene.cameras[0];
  const Pixel center = project(a, {0, 0, 0});
  EXPECT_NEAR(center.u, a.cx, 1e-12);
  EXPECT_NEAR(center.v, a.cy, 1e-12);
  EXPECT_NEAR(center.depth, 5, 1e-12);
  EXPECT_GT(project(a, {0, 1, 0}).v, a.cy);
  // Every image: points placed in COLMAP's camera frame come back to the pixel COLMAP predicts.
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < scene.image_paths.size(); ++i)
    index[fs::path(scene.image_paths[i]).lexically_relative(root + "/images").string()] = i;
  for (const auto& image : f.images) {
    const Camera& c = scene.cameras.at(index.at(image.name));
    const auto& cam = f.cameras[image.camera_id == 1 ? 0 : 1];
    const double fx = cam.params[0], fy = cam.params[1], cx = cam.params[2], cy = cam.params[3];
    const std::array<double, 4> conj = {image.q[0], -image.q[1], -image.q[2], -image.q[3]};
    for (const Vec3& p_cam : {Vec3{0.3, -0.2, 2.0}, Vec3{-0.5, 0.4, 3.5}, Vec3{0, 0, 1}}) {
      const Vec3 X = rotate(conj, sub(p_cam, image.t));  // X = R^T (p_cam - t)
      const Pixel got = project(c, X);
      EXPECT_NEAR(got.depth, p_cam[2], kPixelTolerance) << image.name;
      EXPECT_NEAR(got.u, fx * p_cam[0] / p_cam[2] + cx, kPixelTolerance) << image.name;
      EXPECT_NEAR(got.v, fy * p_cam[1] / p_cam[2] + cy, kPixelTolerance) << image.name;
    }
  }
}

TEST(Colmap, UnsupportedCameraModelIsNamed) {
  TempDir tmp;
  const std::string text = tmp / "t", binary = tmp / "b";
  const ColmapFixture f = colmap_fixture(text, "FULL_OPENCV", std::vector<double>(12, 0.1));
  write_colmap_text(text + "/sparse/0", f);
  expect_convert_fails(tmp, text, {"FULL_OPENCV", text + "/sparse/0/cameras.txt"});
  const ColmapFixture g = colmap_fixture(binary, "OPENCV_FISHEYE", std::vector<double>(8, 0.1));
  write_colmap_binary(binary + "/sparse/0", g);
  expect_convert_fails(tmp, binary, {"OPENCV_FISHEYE", binary + "/sparse/0/cameras.bin"});
}

TEST(Colmap, NonFinitePoseOrUnknownCameraIdIsNamed) {
  TempDir tmp;
  const std::string root = tmp / "nan";
  ColmapFixture f = colmap_fixture(root);
  f.images[2].t[1] = NAN;
  write_colmap_binary(root + "/sparse/0", f);
  expect_convert_fails(tmp, root, {root + "/sparse/0/images.bin", "sub/b.png", "not finite"});
  f = colmap_fixture(root);
  f.images[0].camera_id = 42;
  write_colmap_binary(root + "/sparse/0", f);
  expect_convert_fails(tmp, root, {root + "/sparse/0/images.bin", "camera 42"});
}

// Finite poses too far apart for doubles (found by the colmap fuzz target: a translation of
// -1e308 made the bounds -inf): refused by the import, naming the source, not by the writer.
TEST(Colmap, PosesTooFarApartForDoublesAreRefused) {
  TempDir tmp;
  const std::string root = tmp / "far";
  ColmapFixture f = colmap_fixture(root);
  f.images[1].t[2] = -1e308;
  f.images[3].t[2] = 1e308;
  write_colmap_binary(root + "/sparse/0", f);
  expect_convert_fails(tmp, root, {root + "/sparse/0", "too far apart to normalize"});
  data::ImportOptions keep;
  keep.normalize = false;  // the same poses kept as they are: the bounds overflow instead
  expect_convert_fails(tmp, root, {root + "/sparse/0 (as imported)", "non-finite"}, keep);
}

TEST(Colmap, MissingImagesFolderAsksForImagesFlag) {
  TempDir tmp;
  const std::string root = tmp / "m";
  const ColmapFixture f = colmap_fixture(tmp / "elsewhere");
  write_colmap_text(root + "/sparse/0", f);
  expect_convert_fails(tmp, root, {root + "/images", "--images"});
  data::ImportOptions options;
  options.images_dir = tmp / "elsewhere/images";
  EXPECT_EQ(data::read_source(root, options).cameras.size(), 5u);
}

// ---- Downscaling ---------------------------------------------------------------------------------

TEST(Downscale, IntrinsicsScaleAndPointsLandOnTheSameFeature) {
  // Pixel (i, j) covers [i, i+1) x [j, j+1): after a K-fold box downscale a point at u lands at
  // u / K, in the pixel that holds the block it was in. Each point sits near a block's top-left
  // corner, where the other convention (centers on integers: u' = (u + 0.5) / K - 0.5) would put
  // it in the previous pixel.
  constexpr int K = 4, W = 32, H = 24;
  TempDir tmp;
  const std::string dir = tmp / "ds";
  const Matrix4 pose = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 5, 0, 0, 0, 1};  // looks at the origin
  const double fx = 20, fy = 22, cx = 16, cy = 12;
  struct Feature {
    double u, v;
    std::array<uint8_t, 3> color;
  };
  const Feature features[] = {{4 * 1 + 0.2, 4 * 1 + 0.3, {250, 0, 0}},
                              {4 * 5 + 0.1, 4 * 2 + 0.05, {0, 250, 0}},
                              {4 * 6 + 0.05, 4 * 4 + 0.15, {0, 0, 250}}};
  auto image = torch::full({H, W, 3}, 100, torch::kUInt8);
  for (const Feature& f : features) {  // paint the K x K block holding the feature's pixel
    const int bx = static_cast<int>(f.u) / K * K, by = static_cast<int>(f.v) / K * K;
    for (int c = 0; c < 3; ++c) image.slice(0, by, by + K).slice(1, bx, bx + K).select(2, c).fill_(f.color[c]);
  }
  write_png_in(dir + "/images/a.png", image);
  write_png_in(dir + "/images/b.png", pattern(34, 26, 1));  // not a multiple of K: 8x6
  json frames = json::array({{{"file_path", "images/a.png"}, {"transform_matrix", matrix_json(pose)}},
                             {{"file_path", "images/b.png"}, {"w", 34}, {"h", 26}, {"cx", 17.0}, {"cy", 13.0},
                              {"transform_matrix", matrix_json(ring_poses(1)[0])}}});
  write_json(dir + "/transforms.json", {{"fl_x", fx}, {"fl_y", fy}, {"cx", cx}, {"cy", cy},
                                        {"w", W}, {"h", H}, {"frames", frames}});
  data::ImportOptions options = keep_coordinates();
  options.downscale = K;
  const auto scene = data::read_source(dir, options);
  const Camera& c = scene.cameras[0];
  EXPECT_EQ(intrinsics_of(c), (std::array<double, 8>{fx / K, fy / K, cx / K, cy / K, 0, 0, 0, 0}));
  EXPECT_EQ(c.width, W / K);
  EXPECT_EQ(c.height, H / K);
  EXPECT_EQ(scene.cameras[1].width, 8);
  EXPECT_EQ(scene.cameras[1].height, 6);
  EXPECT_EQ(scene.cameras[1].cx, 17.0 / K);
  EXPECT_NE(scene.meta.source.find("downscale=4"), std::string::npos);

  const std::string out = tmp / "ds.h5";
  data::write_scene(scene, out);
  const data::SceneReader reader(out);
  const auto small = reader.read_image(0);
  ASSERT_EQ(small.sizes().vec(), (std::vector<int64_t>{H / K, W / K, 3}));
  EXPECT_EQ(reader.read_image(1).sizes().vec(), (std::vector<int64_t>{6, 8, 3}));
  for (const Feature& f : features) {
    // The scene point behind the full-resolution pixel (u, v), at depth 5.
    const double depth = 5;
    const Vec3 X = {depth * (f.u - cx) / fx, -depth * (f.v - cy) / fy, 5 - depth};
    const Pixel full = project_gl(pose, fx, fy, cx, cy, X);
    ASSERT_NEAR(full.u, f.u, 1e-9);
    const Pixel p = project(c, X);
    EXPECT_NEAR(p.u, f.u / K, 1e-9);
    EXPECT_NEAR(p.v, f.v / K, 1e-9);
    const auto x = static_cast<int64_t>(std::floor(p.u)), y = static_cast<int64_t>(std::floor(p.v));
    for (int ch = 0; ch < 3; ++ch)
      EXPECT_EQ(small[y][x][ch].item<int>(), f.color[ch]) << "feature at (" << f.u << ", " << f.v << ")";
  }
}

TEST(Downscale, AlphaWeightsTheColor) {
  // Transparent pixels (black, alpha 0) must not darken the opaque ones they are averaged with.
  TempDir tmp;
  const std::string dir = tmp / "alpha";
  write_blender(dir, {2, 0, 0});
  auto rgb = torch::zeros({kH, kW, 3}, torch::kUInt8);
  auto alpha = torch::zeros({kH, kW}, torch::kUInt8);
  for (int x = 1; x < kW; x += 2) {  // every odd column opaque orange
    rgb.select(1, x).copy_(torch::tensor({200, 100, 50}, torch::kUInt8).expand({kH, 3}));
    alpha.select(1, x).fill_(255);
  }
  write_png_in(dir + "/train/r_0.png", rgb, alpha);
  data::ImportOptions options;
  options.downscale = 2;
  const std::string out = tmp / "alpha.h5";
  data::write_scene(data::read_source(dir, options), out);
  const data::SceneReader reader(out);
  const auto small = reader.read_image(0), small_alpha = reader.read_alpha(0);
  EXPECT_TRUE(torch::equal(small, torch::tensor({200, 100, 50}, torch::kUInt8).expand({kH / 2, kW / 2, 3})));
  EXPECT_TRUE(torch::equal(small_alpha, torch::full({kH / 2, kW / 2}, 128, torch::kUInt8)));
}

// ---- Images already scaled (--images-scaled) ----------------------------------------------------

namespace {

// A one-frame transforms.json whose intrinsics are for a `file_w` x `file_h` camera, listing
// `image` (relative to `dir`), looking at the origin from (0, 0, 5).
void write_one_frame(const std::string& dir, const std::string& image, int file_w, int file_h,
                     double fx, double fy, double cx, double cy) {
  const Matrix4 pose = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 5, 0, 0, 0, 1};
  write_json(dir + "/transforms.json",
             {{"fl_x", fx}, {"fl_y", fy}, {"cx", cx}, {"cy", cy}, {"w", file_w}, {"h", file_h},
              {"k1", 0.02}, {"p2", -0.001},
              {"frames", {{{"file_path", image}, {"transform_matrix", matrix_json(pose)}}}}});
}

// The world point seen at pixel (u, v), `depth` ahead, by a camera posed as `c` with the given
// intrinsics: project() inverted. Built on the imported pose, it does not depend on how the
// import places the world.
Vec3 unproject(const Camera& c, double fx, double fy, double cx, double cy, double u, double v,
               double depth) {
  const auto& m = c.camera_to_world;
  const Vec3 p = {depth * (u - cx) / fx, depth * (v - cy) / fy, depth};
  Vec3 X;
  for (int r = 0; r < 3; ++r) X[r] = m[r * 4 + 3] + m[r * 4] * p[0] + m[r * 4 + 1] * p[1] + m[r * 4 + 2] * p[2];
  return X;
}

// `c` with the intrinsics and size its file gives (before --images-scaled).
Camera as_in_file(Camera c, int w, int h, double fx, double fy, double cx, double cy) {
  c.width = w, c.height = h, c.fx = fx, c.fy = fy, c.cx = cx, c.cy = cy;
  return c;
}

data::ImportOptions images_scaled(int downscale = 1) {
  data::ImportOptions options;
  options.images_scaled = true;
  options.downscale = downscale;
  return options;
}

}  // namespace

TEST(ImagesScaled, RefusedWithoutTheFlagWhichTheErrorSuggests) {
  TempDir tmp;
  const std::string dir = tmp / "ns";
  write_png_in(dir + "/images_4/a.png", pattern(8, 6, 0));
  write_one_frame(dir, "images_4/a.png", 32, 24, 20, 22, 16, 12);
  expect_convert_fails(tmp, dir, {dir + "/images_4/a.png", "8x6", "32x24", "--images-scaled"});
}

TEST(ImagesScaled, QuarterSizeImagesScaleExactlyAndPointsLandOnTheSameFeature) {
  // A folder of images box-downscaled by 4 (as `images_4/`), under a transforms.json written for
  // the full size: as in Downscale.IntrinsicsScaleAndPointsLandOnTheSameFeature, each point sits
  // near the top-left corner of a painted 4 x 4 block and must project into that block's pixel.
  constexpr int K = 4, W = 32, H = 24;
  TempDir tmp;
  const std::string dir = tmp / "ns";
  const Matrix4 pose = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 5, 0, 0, 0, 1};
  const double fx = 20, fy = 22, cx = 16, cy = 12;
  struct Feature {
    double u, v;
    std::array<uint8_t, 3> color;
  };
  const Feature features[] = {{4 * 1 + 0.2, 4 * 1 + 0.3, {250, 0, 0}},
                              {4 * 5 + 0.1, 4 * 2 + 0.05, {0, 250, 0}},
                              {4 * 6 + 0.05, 4 * 4 + 0.15, {0, 0, 250}}};
  auto image = torch::full({H, W, 3}, 100, torch::kUInt8);
  for (const Feature& f : features) {
    const int bx = static_cast<int>(f.u) / K * K, by = static_cast<int>(f.v) / K * K;
    for (int c = 0; c < 3; ++c) image.slice(0, by, by + K).slice(1, bx, bx + K).select(2, c).fill_(f.color[c]);
  }
  write_png_in(dir + "/images_4/a.png", data::downscale(image, K));
  // Sizes that are not multiples of 4: 34x26 floors to 8x6, 35x26 rounds to 9x7 (8.75, 6.5).
  write_png_in(dir + "/images_4/b.png", pattern(8, 6, 1));
  write_png_in(dir + "/images_4/c.png", pattern(9, 7, 2));
  const Matrix4 other = ring_poses(1)[0];
  json frames = json::array(
      {{{"file_path", "images_4/a.png"}, {"transform_matrix", matrix_json(pose)}},
       {{"file_path", "images_4/b.png"}, {"w", 34}, {"h", 26}, {"cx", 17.0}, {"cy", 13.0},
        {"transform_matrix", matrix_json(other)}},
       {{"file_path", "images_4/c.png"}, {"w", 35}, {"h", 26}, {"cx", 17.5}, {"cy", 13.0},
        {"transform_matrix", matrix_json(other)}}});
  write_json(dir + "/transforms.json", {{"fl_x", fx}, {"fl_y", fy}, {"cx", cx}, {"cy", cy},
                                        {"w", W}, {"h", H}, {"k1", 0.02}, {"frames", frames}});
  const auto scene = data::read_source(dir, images_scaled());
  ASSERT_EQ(scene.cameras.size(), 3u);
  const Camera& c = scene.cameras[0];
  EXPECT_EQ(intrinsics_of(c), (std::array<double, 8>{fx / K, fy / K, cx / K, cy / K, 0.02, 0, 0, 0}));
  EXPECT_EQ(c.width, W / K);
  EXPECT_EQ(c.height, H / K);
  EXPECT_EQ(intrinsics_of(scene.cameras[1]), (std::array<double, 8>{fx / K, fy / K, 17.0 / K, 13.0 / K, 0.02, 0, 0, 0}));
  EXPECT_EQ(scene.cameras[1].width, 8);
  EXPECT_EQ(scene.cameras[1].height, 6);
  EXPECT_EQ(intrinsics_of(scene.cameras[2]), (std::array<double, 8>{fx / K, fy / K, 17.5 / K, 13.0 / K, 0.02, 0, 0, 0}));
  EXPECT_EQ(scene.cameras[2].width, 9);
  EXPECT_EQ(scene.cameras[2].height, 7);
  EXPECT_EQ(scene.downscale, 1);
  EXPECT_NE(scene.meta.source.find(" images-scaled"), std::string::npos) << scene.meta.source;
  EXPECT_EQ(scene.meta.source.find("downscale="), std::string::npos) << scene.meta.source;

  const std::string out = tmp / "scaled.h5";
  data::write_scene(scene, out);
  const data::SceneReader reader(out);
  EXPECT_EQ(reader.meta().source, scene.meta.source);
  const auto small = reader.read_image(0);
  ASSERT_EQ(small.sizes().vec(), (std::vector<int64_t>{H / K, W / K, 3}));
  for (const Feature& f : features) {
    // The scene point behind the full-size pixel (u, v), 5 ahead.
    const Vec3 X = unproject(c, fx, fy, cx, cy, f.u, f.v, 5);
    const Pixel at_full = project(as_in_file(c, W, H, fx, fy, cx, cy), X);
    ASSERT_NEAR(at_full.u, f.u, 1e-9);
    ASSERT_NEAR(at_full.v, f.v, 1e-9);
    const Pixel p = project(c, X);
    EXPECT_NEAR(p.u, f.u / K, 1e-9);
    EXPECT_NEAR(p.v, f.v / K, 1e-9);
    const auto x = static_cast<int64_t>(std::floor(p.u)), y = static_cast<int64_t>(std::floor(p.v));
    for (int ch = 0; ch < 3; ++ch)
      EXPECT_EQ(small[y][x][ch].item<int>(), f.color[ch]) << "feature at (" << f.u << ", " << f.v << ")";
  }

  // --downscale applies on top: 8x6 by 2 is 4x3, and the intrinsics are the file's / 8.
  const auto twice = data::read_source(dir, images_scaled(2));
  EXPECT_EQ(intrinsics_of(twice.cameras[0]), (std::array<double, 8>{fx / 8, fy / 8, cx / 8, cy / 8, 0.02, 0, 0, 0}));
  EXPECT_EQ(twice.cameras[0].width, 4);
  EXPECT_EQ(twice.cameras[0].height, 3);
  EXPECT_EQ(twice.cameras[2].width, 4);  // 9 / 2
  EXPECT_NE(twice.meta.source.find(" images-scaled downscale=2"), std::string::npos) << twice.meta.source;
  const std::string out2 = tmp / "twice.h5";
  data::write_scene(twice, out2);
  EXPECT_EQ(data::SceneReader(out2).read_image(0).sizes().vec(), (std::vector<int64_t>{3, 4, 3}));
}

TEST(ImagesScaled, NonIntegerFactorScalesEachAxis) {
  TempDir tmp;
  const double fx = 20, fy = 22, cx = 15.25, cy = 10.5;
  struct Case {
    int image_w, image_h;  // for a file camera of 30x20
  };
  // 0.4333 x 0.45 (within one pixel's worth, 1/30 + 1/20, of one factor; no integer K fits),
  // exactly 0.6 on both, and a larger image than the file says (x2).
  for (const Case& k : {Case{13, 9}, Case{18, 12}, Case{60, 40}}) {
    SCOPED_TRACE(std::to_string(k.image_w) + "x" + std::to_string(k.image_h));
    const std::string dir = tmp / ("ns" + std::to_string(k.image_w));
    write_png_in(dir + "/small/a.png", pattern(k.image_w, k.image_h, 0));
    write_one_frame(dir, "small/a.png", 30, 20, fx, fy, cx, cy);
    const auto scene = data::read_source(dir, images_scaled());
    const Camera& c = scene.cameras[0];
    const double sx = k.image_w / 30.0, sy = k.image_h / 20.0;
    EXPECT_EQ(c.width, k.image_w);
    EXPECT_EQ(c.height, k.image_h);
    EXPECT_DOUBLE_EQ(c.fx, fx * sx);
    EXPECT_DOUBLE_EQ(c.cx, cx * sx);
    EXPECT_DOUBLE_EQ(c.fy, fy * sy);
    EXPECT_DOUBLE_EQ(c.cy, cy * sy);
    EXPECT_EQ(c.k1, 0.02);  // distortion acts on normalized coordinates: unchanged
    EXPECT_EQ(c.p2, -0.001);
    // A point seen at full-size pixel (u, v) is seen at (u sx, v sy) in the resized image.
    const double u = 7.3, v = 15.9, depth = 3;
    const Vec3 X = unproject(c, fx, fy, cx, cy, u, v, depth);
    ASSERT_NEAR(project(as_in_file(c, 30, 20, fx, fy, cx, cy), X).u, u, 1e-9);
    const Pixel p = project(c, X);
    EXPECT_NEAR(p.u, u * sx, 1e-9);
    EXPECT_NEAR(p.v, v * sy, 1e-9);
  }
}

TEST(ImagesScaled, AspectChangeIsRefused) {
  TempDir tmp;
  const std::string dir = tmp / "ns";
  write_png_in(dir + "/crop/a.png", pattern(32, 16, 0));
  write_one_frame(dir, "crop/a.png", 32, 24, 20, 22, 16, 12);
  expect_convert_fails(tmp, dir, {dir + "/crop/a.png", "32x16", "32x24", "x by 1", "y by 0.666667",
                                  "aspect"},
                       images_scaled());
  // Half the width only: 0.5 against 1.
  write_png_in(dir + "/crop/a.png", pattern(16, 24, 0));
  expect_convert_fails(tmp, dir, {dir + "/crop/a.png", "16x24", "x by 0.5", "y by 1"}, images_scaled());
}

TEST(ImagesScaled, ColmapModelWithQuarterSizeImages) {
  // The fixture's images (16x12 and 32x12) under a model written for 4x that size: the import
  // with --images-scaled gives exactly the cameras of the fixture's own model.
  TempDir tmp;
  for (bool binary : {false, true}) {
    SCOPED_TRACE(binary ? "binary" : "text");
    const std::string plain = tmp / (binary ? "plain_bin" : "plain_txt");
    const std::string big = tmp / (binary ? "big_bin" : "big_txt");
    const ColmapFixture f = colmap_fixture(plain);
    ColmapFixture g = f;
    for (auto& camera : g.cameras) {
      camera.width *= 4;
      camera.height *= 4;
      for (size_t p = 0; p < 4; ++p) camera.params[p] *= 4;  // OPENCV, PINHOLE: fx fy cx cy first
    }
    binary ? write_colmap_binary(plain + "/sparse/0", f) : write_colmap_text(plain + "/sparse/0", f);
    binary ? write_colmap_binary(big + "/sparse/0", g) : write_colmap_text(big + "/sparse/0", g);
    data::ImportOptions options = images_scaled();
    options.images_dir = plain + "/images";
    const auto want = data::read_source(plain);
    const auto got = data::read_source(big, options);
    expect_same_cameras(got.cameras, want.cameras, 0);
    EXPECT_EQ(got.image_paths, want.image_paths);
    EXPECT_NE(got.meta.source.find(" images-scaled"), std::string::npos) << got.meta.source;
    EXPECT_EQ(want.meta.source.find("images-scaled"), std::string::npos) << want.meta.source;
    // Without the flag: refused, naming the first image by name order and the flag.
    options.images_scaled = false;
    expect_convert_fails(tmp, big, {plain + "/images/a.png", "16x12", "64x48", "--images-scaled"}, options);
  }
}

TEST(ImagesScaled, NoEffectWhenSizesMatchOrOnBlender) {
  TempDir tmp;
  write_blender(tmp / "lego");
  const auto plain = data::read_source(tmp / "lego");
  const auto flagged = data::read_source(tmp / "lego", images_scaled());
  expect_same_cameras(flagged.cameras, plain.cameras, 0);
  EXPECT_EQ(flagged.meta.source, plain.meta.source);
  EXPECT_EQ(flagged.meta.source.find("images-scaled"), std::string::npos);
  const std::string dir = tmp / "ns";
  write_png_in(dir + "/a.png", pattern(kW, kH, 0));
  write_one_frame(dir, "a.png", kW, kH, 14, 15, 8, 6);
  const auto same = data::read_source(dir, images_scaled());
  expect_same_cameras(same.cameras, data::read_source(dir).cameras, 0);
  EXPECT_EQ(same.meta.source.find("images-scaled"), std::string::npos) << same.meta.source;
}

// ---- Bad input: a UserError naming the file, and no output left behind ---------------------------

TEST(BadInput, MissingInputAndNothingRecognizable) {
  TempDir tmp;
  expect_convert_fails(tmp, tmp / "nowhere", {tmp / "nowhere", "does not exist"});
  write_text(tmp / "junk/readme.txt", "hello");
  expect_convert_fails(tmp, tmp / "junk", {tmp / "junk", "transforms_train.json", "transforms.json",
                                           "cameras.bin", "sparse/0"});
}

TEST(BadInput, MissingUnreadableOrWrongSizeImage) {
  TempDir tmp;
  const std::string dir = tmp / "lego";
  write_blender(dir);
  fs::remove(dir + "/train/r_1.png");
  expect_convert_fails(tmp, dir, {dir + "/train/r_1.png"});
  write_text(dir + "/train/r_1.png", "not an image at all");
  expect_convert_fails(tmp, dir, {dir + "/train/r_1.png", "PNG or JPEG"});

  const std::string ns = tmp / "ns";
  write_png_in(ns + "/a.png", pattern(20, kH, 0));
  write_json(ns + "/transforms.json", {{"fl_x", 14.0}, {"w", kW}, {"h", kH},
                                       {"frames", {{{"file_path", "a.png"}, {"transform_matrix", matrix_json(ring_poses(1)[0])}}}}});
  expect_convert_fails(tmp, ns, {ns + "/a.png", "20x12", "16x12"});
}

TEST(BadInput, ImageCorruptPastItsHeaderLeavesNoOutput) {
  // The header passes the checks; decoding fails halfway through writing: the writer's temporary
  // file must go away with it.
  TempDir tmp;
  const std::string dir = tmp / "lego";
  write_blender(dir);
  const std::string victim = dir + "/val/r_1.png";
  const std::string bytes = tessera::test::read_file(victim);
  write_text(victim, bytes.substr(0, bytes.size() / 2));
  expect_convert_fails(tmp, dir, {victim});
}

TEST(BadInput, NonFiniteOrDegeneratePoseInJson) {
  TempDir tmp;
  const std::string dir = tmp / "pose";
  write_blender(dir);
  const std::string path = dir + "/transforms_val.json";
  const std::string good = tessera::test::read_file(path);
  json meta = json::parse(good);
  // Python's json.dump writes NaN as a bare word, which is not JSON.
  std::string text = meta.dump();
  const std::string first = meta["frames"][0]["transform_matrix"][0].dump();
  text.replace(text.find(first), first.size(), "[NaN, 0, 0, 0]");
  write_text(path, text);
  expect_convert_fails(tmp, dir, {path, "NaN"});
  // A number too large for a double.
  text = meta.dump();
  text.replace(text.find(first), first.size(), "[1e999, 0, 0, 0]");
  write_text(path, text);
  expect_convert_fails(tmp, dir, {path, "1e999"});
  // A rotation scaled to nothing.
  json degenerate = meta;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) degenerate["frames"][1]["transform_matrix"][r][c] = 0.0;
  write_json(path, degenerate);
  expect_convert_fails(tmp, dir, {path, "orthonormal"});
  // A 3x3 matrix is not a pose.
  json small = meta;
  small["frames"][0]["transform_matrix"] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  write_json(path, small);
  expect_convert_fails(tmp, dir, {path, "transform_matrix"});
}

TEST(BadInput, MalformedJsonNamesTheFile) {
  TempDir tmp;
  const std::string dir = tmp / "broken";
  write_text(dir + "/transforms.json", "{ \"frames\": [ {\"file_path\": \"a.png\", ");
  expect_convert_fails(tmp, dir, {dir + "/transforms.json", "malformed JSON"});
  write_text(dir + "/transforms.json", "{ \"fl_x\": \"wide\", \"frames\": [ {\"file_path\": \"a.png\"} ] }");
  write_png_in(dir + "/a.png", pattern(kW, kH, 0));
  expect_convert_fails(tmp, dir, {dir + "/transforms.json", "fl_x"});
}

TEST(BadInput, BadOptions) {
  TempDir tmp;
  const std::string dir = tmp / "lego";
  write_blender(dir);
  data::ImportOptions options;
  options.downscale = 0;
  expect_convert_fails(tmp, dir, {"--downscale"}, options);
  options.downscale = 13;  // larger than the 12-pixel height
  expect_convert_fails(tmp, dir, {dir + "/train/r_0.png", "--downscale 13"}, options);
  options = {};
  options.images_dir = tmp / "x";
  expect_convert_fails(tmp, dir, {"--images"}, options);
}

// ---- Export to nerfstudio ------------------------------------------------------------------------

void expect_same_scene_files(const std::string& a_path, const std::string& b_path) {
  const data::SceneReader a(a_path), b(b_path);
  expect_same_cameras(a.cameras(), b.cameras(), kPoseTolerance);
  ASSERT_EQ(a.has_alpha(), b.has_alpha());
  ASSERT_EQ(a.has_points(), b.has_points());
  for (size_t i = 0; i < a.cameras().size(); ++i) {
    EXPECT_TRUE(torch::equal(a.read_image(i), b.read_image(i))) << "image " << i;
    if (a.has_alpha()) {
      EXPECT_TRUE(torch::equal(a.read_alpha(i), b.read_alpha(i))) << "alpha " << i;
    }
  }
  EXPECT_TRUE(torch::equal(a.read_points_xyz(), b.read_points_xyz()));
  EXPECT_TRUE(torch::equal(a.read_points_rgb(), b.read_points_rgb()));
}

TEST(Export, NerfstudioRoundTripKeepsCamerasImagesAndPoints) {
  TempDir tmp;
  write_blender(tmp / "lego");  // alpha, three splits
  const ColmapFixture f = colmap_fixture(tmp / "colmap");  // points, two image sizes, distortion
  write_colmap_binary(tmp / "colmap/sparse/0", f);
  for (const std::string name : {"lego", "colmap"}) {
    SCOPED_TRACE(name);
    const std::string first = tmp / (name + ".h5"), out = tmp / (name + "_ns"), again = tmp / (name + "_again.h5");
    data::write_scene(data::read_source(tmp / name), first);
    size_t calls = 0;
    data::export_nerfstudio(first, out, [&](size_t done, size_t total) { calls += done <= total; });
    const data::SceneReader reader(first);
    EXPECT_EQ(calls, reader.cameras().size());

    const json meta = json::parse(tessera::test::read_file(out + "/transforms.json"));
    ASSERT_EQ(meta["frames"].size(), reader.cameras().size());
    const json& f0 = meta["frames"][0];
    EXPECT_EQ(f0["file_path"], "images/frame_00000.png");
    EXPECT_EQ(f0["fl_x"].get<double>(), reader.cameras()[0].fx);
    EXPECT_EQ(f0["w"].get<int>(), reader.cameras()[0].width);
    for (const char* key : {"fl_y", "cx", "cy", "h", "k1", "k2", "p1", "p2", "transform_matrix"})
      EXPECT_TRUE(f0.contains(key)) << key;
    // OpenGL in the file: the camera's z column is negated relative to the OpenCV pose.
    EXPECT_EQ(f0["transform_matrix"][0][2].get<double>(), -reader.cameras()[0].camera_to_world[2]);
    size_t listed = meta["train_filenames"].size() + meta["val_filenames"].size() + meta["test_filenames"].size();
    EXPECT_EQ(listed, reader.cameras().size());
    EXPECT_TRUE(fs::exists(out + "/images/frame_00000.png"));
    EXPECT_EQ(data::read_image_file(out + "/images/frame_00000.png").alpha.defined(), reader.has_alpha());
    EXPECT_EQ(fs::exists(out + "/points3D.ply"), reader.has_points());
    EXPECT_EQ(meta.contains("ply_file_path"), reader.has_points());

    data::write_scene(data::read_source(out), again);
    expect_same_scene_files(first, again);
  }
}

TEST(Export, RefusesANonEmptyFolder) {
  TempDir tmp;
  write_blender(tmp / "lego");
  const std::string scene = tmp / "lego.h5";
  data::write_scene(data::read_source(tmp / "lego"), scene);
  write_text(tmp / "busy/keep.txt", "mine");
  expect_user_error([&] { data::export_nerfstudio(scene, tmp / "busy"); }, {tmp / "busy", "not empty"});
  EXPECT_EQ(tessera::test::read_file(tmp / "busy/keep.txt"), "mine");
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp / "busy")) ++entries;
  EXPECT_EQ(entries, 1u);
  fs::create_directories(tmp / "empty");  // an empty folder is fine, and so is "out/"
  data::export_nerfstudio(scene, tmp / "empty/");
  EXPECT_TRUE(fs::exists(tmp / "empty/transforms.json"));
  // A missing scene is refused before anything is created.
  expect_user_error([&] { data::export_nerfstudio(tmp / "none.h5", tmp / "fresh"); }, {tmp / "none.h5"});
  EXPECT_FALSE(fs::exists(tmp / "fresh"));
}

// ---- The real binary ---------------------------------------------------------------------------

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `tessera ARGS`; returns the exit code, with stdout and stderr in the given strings.
int run_tessera(const TempDir& tmp, const std::vector<std::string>& args, std::string* out, std::string* err) {
  const char* binary = std::getenv("TESSERA_BINARY");
  std::string command = quote(binary ? binary : "tessera");
  for (const auto& arg : args) command += " " + quote(arg);
  command += " >" + quote(tmp / "stdout.txt") + " 2>" + quote(tmp / "stderr.txt") + " </dev/null";
  const int status = std::system(command.c_str());
  *out = tessera::test::read_file(tmp / "stdout.txt");
  *err = tessera::test::read_file(tmp / "stderr.txt");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Cli, ConvertExitsZeroOnGoodInputAndTwoOnBad) {
  const char* binary = std::getenv("TESSERA_BINARY");
  ASSERT_TRUE(binary && fs::is_regular_file(binary))
      << "TESSERA_BINARY is not set to the tessera executable; run through CTest (ctest -R test_import)";
  TempDir tmp;
  write_blender(tmp / "lego");
  std::string out, err;
  const std::string scene = tmp / "scenes/lego.h5";
  EXPECT_EQ(run_tessera(tmp, {"convert", tmp / "lego", "--out", scene, "--downscale", "2"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("6 cameras (3 train, 2 val, 1 test) at 8x6"), std::string::npos) << out;
  EXPECT_NE(err.find("6/6 images"), std::string::npos) << err;
  EXPECT_EQ(data::SceneReader(scene).cameras()[0].width, kW / 2);

  EXPECT_EQ(run_tessera(tmp, {"convert", scene, "--to", "nerfstudio", tmp / "ns"}, &out, &err), 0) << err;
  EXPECT_TRUE(fs::exists(tmp / "ns/transforms.json"));

  const std::string bad = tmp / "bad.h5";
  EXPECT_EQ(run_tessera(tmp, {"convert", tmp / "missing", "--out", bad}, &out, &err), 2);
  EXPECT_NE(err.find(tmp / "missing"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(bad));
  EXPECT_EQ(run_tessera(tmp, {"convert", scene, "--to", "nerfstudio", tmp / "ns"}, &out, &err), 2);
  EXPECT_NE(err.find("not empty"), std::string::npos) << err;
  EXPECT_EQ(run_tessera(tmp, {"convert", tmp / "lego"}, &out, &err), 2) << "neither --out nor --to";
  EXPECT_EQ(run_tessera(tmp, {"convert", tmp / "lego", "--out", bad, "--downscale", "0"}, &out, &err), 2);

  EXPECT_EQ(run_tessera(tmp, {"convert", "--help"}, &out, &err), 0);
  for (const char* flag : {"--out", "--to", "--downscale", "--split-every", "--images", "--images-scaled"})
    EXPECT_NE(out.find(flag), std::string::npos) << flag;
  EXPECT_NE(out.find("=8"), std::string::npos) << "--split-every shows its default";
  EXPECT_NE(out.find("=1"), std::string::npos) << "--downscale shows its default";
}

TEST(Cli, ConvertImagesScaledExitsTwoWithoutTheFlagAndZeroWithIt) {
  const char* binary = std::getenv("TESSERA_BINARY");
  ASSERT_TRUE(binary && fs::is_regular_file(binary))
      << "TESSERA_BINARY is not set to the tessera executable; run through CTest (ctest -R test_import)";
  TempDir tmp;
  const std::string dir = tmp / "ns";
  write_png_in(dir + "/images_4/a.png", pattern(8, 6, 0));
  write_one_frame(dir, "images_4/a.png", 32, 24, 20, 22, 16, 12);
  std::string out, err;
  const std::string scene = tmp / "scene.h5";
  EXPECT_EQ(run_tessera(tmp, {"convert", dir, "--out", scene}, &out, &err), 2);
  EXPECT_NE(err.find("--images-scaled"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(scene));
  EXPECT_EQ(run_tessera(tmp, {"convert", dir, "--out", scene, "--images-scaled"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("1 cameras (1 train, 0 val, 0 test) at 8x6"), std::string::npos) << out;
  EXPECT_EQ(data::SceneReader(scene).cameras()[0].fx, 5.0);
  EXPECT_EQ(run_tessera(tmp, {"info", scene}, &out, &err), 0) << err;
  EXPECT_NE(out.find("images-scaled"), std::string::npos) << out;
  // An import flag: not with --to.
  EXPECT_EQ(run_tessera(tmp, {"convert", scene, "--to", "nerfstudio", tmp / "x", "--images-scaled"}, &out, &err), 2);
  EXPECT_FALSE(fs::exists(tmp / "x"));
}
