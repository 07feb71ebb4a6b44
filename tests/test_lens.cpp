// Tests of the OpenCV lens model (framework/data/lens.h) and of every path that honors it: NeRF
// rays (pixel_rays), `tessera synth --distortion`, and image undistortion for the 3DGS targets.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "distributed/errors.h"
#include "framework/data/lens.h"
#include "framework/data/scene.h"
#include "framework/data/synth.h"
#include "models/nerf/ray_sampler.h"
#include "tests/test_util.h"

namespace tessera::data {
namespace {

using models::nerf::pixel_rays;

// distort -> undistort returns to the start within this (normalized units): Newton stops at a
// 1e-12 residual and the Jacobian is within a factor ~2 of the identity for these lenses.
constexpr double kRoundTripTol = 1e-9;
// A ray built in float64 and stored as float32 misses its point by ~1e-7 relative: the origins are
// O(1) and the depths at most 4, so 1e-6 leaves a margin of several times.
constexpr double kRayTol = 1e-6;

struct Coefficients {
  const char* name;
  double k1, k2, p1, p2;
};
// The instant-ngp fox (transforms.json), a strong barrel lens with tangential terms, a pincushion
// lens, a purely tangential one, and none.
const Coefficients kLenses[] = {{"fox", 0.0578, -0.0805, -0.00098, 0.000156},
                                {"strong_barrel", -0.35, 0.08, 0.002, -0.001},
                                {"pincushion", 0.25, 0.1, 0.0, 0.0},
                                {"tangential", 0.0, 0.0, 0.01, -0.008},
                                {"none", 0.0, 0.0, 0.0, 0.0}};

Camera lens_camera(const Coefficients& c, int width = 64, int height = 48) {
  Camera camera;
  camera.width = width, camera.height = height;
  camera.fx = 0.5 * width / std::tan(25.0 * M_PI / 180.0);  // 50 degrees across, as synth
  camera.fy = camera.fx * 1.02;
  camera.cx = 0.5 * width + 0.7, camera.cy = 0.5 * height - 0.4;
  camera.k1 = c.k1, camera.k2 = c.k2, camera.p1 = c.p1, camera.p2 = c.p2;
  return camera;
}

// OpenCV's model as its documentation writes it (calib3d, "Detailed Description"), kept apart
// from lens.cpp so that a slip in either shows.
void reference_distort(const Camera& c, double x, double y, double* xd, double* yd) {
  const double r2 = x * x + y * y, r4 = r2 * r2;
  const double radial = 1 + c.k1 * r2 + c.k2 * r4;
  *xd = x * radial + 2 * c.p1 * x * y + c.p2 * (r2 + 2 * x * x);
  *yd = y * radial + c.p1 * (r2 + 2 * y * y) + 2 * c.p2 * x * y;
}

// The pixel where a camera-space point lands, through the reference model.
void reference_project(const Camera& c, double X, double Y, double Z, double* u, double* v) {
  double xd, yd;
  reference_distort(c, X / Z, Y / Z, &xd, &yd);
  *u = c.fx * xd + c.cx;
  *v = c.fy * yd + c.cy;
}

// A pose: rotation about a tilted axis, translation (0.3, -1.2, 2).
std::array<double, 16> test_pose(double angle) {
  const synth::Vec3 axis = synth::normalize(synth::Vec3{0.3, -0.5, 0.8});
  const auto r = synth::axis_angle_rotation(axis, angle);
  return {r[0], r[1], r[2], 0.3, r[3], r[4], r[5], -1.2, r[6], r[7], r[8], 2.0, 0, 0, 0, 1};
}

// ---- The model -------------------------------------------------------------------------------

TEST(Lens, DistortMatchesTheOpenCvFormulaAndAHandValue) {
  Camera c;
  c.k1 = 0.1, c.k2 = 0.01, c.p1 = 0.001, c.p2 = 0.002;
  double xd, yd;
  distort(c, 0.3, -0.2, &xd, &yd);
  // Exact rational arithmetic: r2 = 0.13, radial = 1.013169.
  EXPECT_NEAR(xd, 0.3044507, 1e-15);
  EXPECT_NEAR(yd, -0.2026638, 1e-15);
  for (const Coefficients& lens : kLenses) {
    const Camera cam = lens_camera(lens);
    for (double x = -0.7; x <= 0.7; x += 0.1)
      for (double y = -0.7; y <= 0.7; y += 0.1) {
        double want_x, want_y;
        reference_distort(cam, x, y, &want_x, &want_y);
        distort(cam, x, y, &xd, &yd);
        EXPECT_NEAR(xd, want_x, 1e-15) << lens.name;
        EXPECT_NEAR(yd, want_y, 1e-15) << lens.name;
      }
  }
}

TEST(Lens, UndistortInvertsDistortOnAGrid) {
  for (const Coefficients& lens : kLenses) {
    const Camera cam = lens_camera(lens);
    double worst = 0, worst_residual = 0;
    constexpr int kGrid = 41;  // normalized points in [-0.6, 0.6]^2: beyond a 62 degree view
    for (int i = 0; i < kGrid; ++i)
      for (int j = 0; j < kGrid; ++j) {
        const double x = -0.6 + 1.2 * i / (kGrid - 1), y = -0.6 + 1.2 * j / (kGrid - 1);
        double xd, yd, bx, by;
        distort(cam, x, y, &xd, &yd);
        undistort(cam, xd, yd, &bx, &by);
        worst = std::max({worst, std::abs(bx - x), std::abs(by - y)});
        // The other way round: undistort a distorted coordinate, distort it back.
        double ux, uy, rx, ry;
        undistort(cam, x, y, &ux, &uy);
        distort(cam, ux, uy, &rx, &ry);
        worst_residual = std::max({worst_residual, std::abs(rx - x), std::abs(ry - y)});
      }
    EXPECT_LE(worst, kRoundTripTol) << lens.name;
    EXPECT_LE(worst_residual, kUndistortTolerance) << lens.name;
  }
}

TEST(Lens, NoDistortionIsTheIdentity) {
  const Camera cam = lens_camera(kLenses[4]);
  EXPECT_FALSE(has_distortion(cam));
  for (const Coefficients& lens : kLenses)
    EXPECT_EQ(has_distortion(lens_camera(lens)), &lens != &kLenses[4]) << lens.name;
  double x, y;
  undistort(cam, 0.123456789, -0.987654321, &x, &y);
  EXPECT_EQ(x, 0.123456789);
  EXPECT_EQ(y, -0.987654321);
  const torch::Tensor image = torch::rand({48, 64, 3});
  EXPECT_TRUE(undistort_image(image, cam).is_same(image));
  EXPECT_EQ(distortion_problem(cam), "");
}

TEST(Lens, DistortionProblemFindsLensesWithoutAnInverse) {
  for (const Coefficients& lens : kLenses)
    EXPECT_EQ(distortion_problem(lens_camera(lens)), "") << lens.name;
  // k1 = -1 folds at r = 1/sqrt(3), where r_d peaks at 0.385, inside the image (r_d up to 0.66).
  // Newton from corner (0, 0) lands on the preimage beyond the fold on the opposite side
  // (r ~ -1.25), which is no ray of that pixel; a little further along the border it finds none.
  Camera fold = synth::pinhole_camera(128, 128, 50, test_pose(0));
  fold.k1 = -1;
  const std::string problem = distortion_problem(fold);
  EXPECT_NE(problem.find("folds over at pixel (0, 0)"), std::string::npos) << problem;
  double x, y;
  undistort(fold, (2.0 - 64) / fold.fx, -64 / fold.fy, &x, &y);
  double xd, yd;
  distort(fold, x, y, &xd, &yd);
  EXPECT_GT(std::hypot(xd - (2.0 - 64) / fold.fx, yd + 64 / fold.fy), 1e-3)
      << "pixel (2, 0) has no preimage: Newton stops at its last iterate";
  EXPECT_NE(distortion_problem(lens_camera({"fold", -1.0, 0, 0, 0})), "");
  EXPECT_NE(distortion_problem(lens_camera({"nan", 0, NAN, 0, 0})).find("k2 is not finite"),
            std::string::npos);
}

// ---- NeRF rays -------------------------------------------------------------------------------

TEST(PixelRays, PassThroughPointsSeenThroughTheLens) {
  std::vector<Camera> cameras;
  for (size_t i = 0; i < 3; ++i) {
    Camera c = lens_camera(kLenses[i], 80 + 8 * i, 60);
    c.camera_to_world = test_pose(0.4 + i);
    cameras.push_back(c);
  }
  synth::Rng rng(7, 0);
  constexpr int kRays = 300;
  std::vector<int64_t> cam_index, xs, ys;
  std::vector<synth::Vec3> points;
  for (int i = 0; i < kRays; ++i) {
    const size_t k = rng.index(cameras.size());
    const Camera& c = cameras[k];
    const int64_t u = static_cast<int64_t>(rng.index(c.width));
    const int64_t v = static_cast<int64_t>(rng.index(c.height));
    // The point on pixel (u, v)'s center at a random depth: undistort, then scale.
    double x, y;
    undistort(c, (u + 0.5 - c.cx) / c.fx, (v + 0.5 - c.cy) / c.fy, &x, &y);
    const double depth = rng.uniform(0.5, 4.0);
    const synth::Vec3 p_cam{x * depth, y * depth, depth};
    double pu, pv;  // it must project back onto the pixel center through the reference model
    reference_project(c, p_cam.x, p_cam.y, p_cam.z, &pu, &pv);
    ASSERT_NEAR(pu, u + 0.5, 1e-9);
    ASSERT_NEAR(pv, v + 0.5, 1e-9);
    const auto& m = c.camera_to_world;
    points.push_back({m[0] * p_cam.x + m[1] * p_cam.y + m[2] * p_cam.z + m[3],
                      m[4] * p_cam.x + m[5] * p_cam.y + m[6] * p_cam.z + m[7],
                      m[8] * p_cam.x + m[9] * p_cam.y + m[10] * p_cam.z + m[11]});
    cam_index.push_back(static_cast<int64_t>(k)), xs.push_back(u), ys.push_back(v);
  }
  // The largest distance from each point to the ray of its pixel.
  auto worst_miss = [&](const std::vector<Camera>& cams) {
    torch::Tensor o, d;
    pixel_rays(cams, torch::tensor(cam_index), torch::tensor(xs), torch::tensor(ys), &o, &d);
    const torch::Tensor o64 = o.to(torch::kFloat64), d64 = d.to(torch::kFloat64);
    const auto oa = o64.accessor<double, 2>();
    const auto da = d64.accessor<double, 2>();
    double worst = 0;
    for (int i = 0; i < kRays; ++i) {
      const synth::Vec3 origin{oa[i][0], oa[i][1], oa[i][2]}, dir{da[i][0], da[i][1], da[i][2]};
      const synth::Vec3 to_point = points[i] - origin;
      const synth::Vec3 off = to_point - dir * synth::dot(to_point, dir);
      EXPECT_GT(synth::dot(to_point, dir), 0);  // in front of the camera
      worst = std::max(worst, synth::length(off));
    }
    return worst;
  };
  EXPECT_LE(worst_miss(cameras), kRayTol);
  // Ignoring the lens misses the same points by far more: the check above has teeth.
  std::vector<Camera> pinholes = cameras;
  for (Camera& c : pinholes) c.k1 = c.k2 = c.p1 = c.p2 = 0;
  EXPECT_GT(worst_miss(pinholes), 1e-3);
}

TEST(PixelRays, WithoutDistortionTheyAreThePinholeRaysExactly) {
  std::vector<Camera> cameras;
  for (size_t i = 0; i < 2; ++i) {
    Camera c = lens_camera(kLenses[4], 40 + 8 * i, 30);
    c.camera_to_world = test_pose(1.1 * i);
    cameras.push_back(c);
  }
  const torch::Tensor cam = torch::tensor({0, 1, 1, 0, 1}, torch::kInt64);
  const torch::Tensor x = torch::tensor({0, 47, 3, 39, 20}, torch::kInt64);
  const torch::Tensor y = torch::tensor({0, 29, 17, 5, 11}, torch::kInt64);
  torch::Tensor o, d;
  pixel_rays(cameras, cam, x, y, &o, &d);
  // The pinhole formula, op for op as pixel_rays computes it.
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor intr = torch::empty({2, 4}, f64), pose = torch::empty({2, 3, 4}, f64);
  for (int64_t i = 0; i < 2; ++i) {
    const Camera& c = cameras[i];
    intr[i] = torch::tensor({c.fx, c.fy, c.cx, c.cy}, f64);
    for (int r = 0; r < 3; ++r)
      for (int k = 0; k < 4; ++k) pose[i][r][k] = c.camera_to_world[r * 4 + k];
  }
  const torch::Tensor in = intr.index_select(0, cam), p = pose.index_select(0, cam);
  const torch::Tensor dx = (x.to(torch::kFloat64) + 0.5 - in.select(1, 2)) / in.select(1, 0);
  const torch::Tensor dy = (y.to(torch::kFloat64) + 0.5 - in.select(1, 3)) / in.select(1, 1);
  const torch::Tensor d_cam = torch::stack({dx, dy, torch::ones_like(dx)}, 1);
  torch::Tensor want = torch::bmm(p.narrow(2, 0, 3), d_cam.unsqueeze(2)).squeeze(2);
  want = (want / want.norm(2, 1, true)).to(torch::kFloat32);
  EXPECT_TRUE(torch::equal(d, want)) << d - want;
  EXPECT_TRUE(torch::equal(o, p.select(2, 3).to(torch::kFloat32)));
}

// ---- Images ----------------------------------------------------------------------------------

TEST(UndistortImage, IsBilinearSamplingAtTheDistortedPositionWithEdgeClamp) {
  // Bilinear interpolation reproduces a linear ramp exactly, so every output pixel must hold the
  // ramp at the (clamped) distorted position of its center. Pincushion pushes the corners out of
  // the image, exercising the clamp; two channels show that any C works.
  for (const Coefficients& lens : {kLenses[1], kLenses[2]}) {
    const Camera c = lens_camera(lens, 40, 30);
    const torch::Tensor u = torch::arange(40, torch::kFloat32).view({1, 40}).expand({30, 40});
    const torch::Tensor v = torch::arange(30, torch::kFloat32).view({30, 1}).expand({30, 40});
    const torch::Tensor image = torch::stack({0.02f * u + 0.01f * v, 0.5f - 0.015f * v}, 2);
    const torch::Tensor out = undistort_image(image, c);
    ASSERT_EQ(out.sizes(), image.sizes());
    const auto oa = out.accessor<float, 3>();
    double worst = 0;
    bool clamped = false;
    for (int row = 0; row < 30; ++row)
      for (int col = 0; col < 40; ++col) {
        double xd, yd;
        reference_distort(c, (col + 0.5 - c.cx) / c.fx, (row + 0.5 - c.cy) / c.fy, &xd, &yd);
        const double sx = c.fx * xd + c.cx - 0.5, sy = c.fy * yd + c.cy - 0.5;
        const double cx = std::clamp(sx, 0.0, 39.0), cy = std::clamp(sy, 0.0, 29.0);
        clamped = clamped || cx != sx || cy != sy;
        worst = std::max({worst, std::abs(oa[row][col][0] - (0.02 * cx + 0.01 * cy)),
                          std::abs(oa[row][col][1] - (0.5 - 0.015 * cy))});
      }
    EXPECT_LE(worst, 2e-6) << lens.name;  // float32 storage of values up to ~1
    EXPECT_EQ(clamped, lens.k1 > 0) << lens.name;  // only pincushion reaches outside
  }
  EXPECT_THROW(undistort_image(torch::zeros({30, 41, 3}), lens_camera(kLenses[0], 40, 30)),
               std::invalid_argument);
}

// The rendered view as float [H, W, 3] over the background.
torch::Tensor composited(const synth::SynthScene& scene, size_t view) {
  const synth::RenderedView r = synth::render_view(scene, view);
  torch::Tensor rgb = r.rgb.to(torch::kFloat32) / 255.0f;
  if (r.alpha.defined()) {
    const torch::Tensor a = r.alpha.to(torch::kFloat32).unsqueeze(2) / 255.0f;
    rgb = rgb * a + (1.0f - a);  // white background
  }
  return rgb;
}

TEST(UndistortImage, TurnsADistortedRenderIntoThePinholeRender) {
  // The "honored vs ignored" proof at image level: synth renders the same cameras with and without
  // a barrel lens; undistorting the distorted render must give back the pinhole render, while the
  // raw distorted render differs clearly (pixels move by up to ~7 pixels at the corners). The room
  // is textured everywhere, so every pixel takes part; at 96 pixels the displacement is several
  // times the blur of bilinear resampling (at 48 pixels the two are only ~2.5x apart).
  constexpr int64_t kSize = 96;
  synth::SynthOptions options;
  options.preset = "room";
  options.views = 3;
  options.width = options.height = kSize;
  const synth::SynthScene pinhole = synth::build_scene(options);
  options.distortion = {-0.3, 0.1, 0.002, -0.001};
  const synth::SynthScene lens = synth::build_scene(options);
  ASSERT_EQ(lens.cameras.size(), pinhole.cameras.size());
  double undistorted_error = 0, raw_error = 0;
  constexpr int64_t kMargin = 2;  // border pixels see the anti-aliasing of other pixels
  for (size_t i = 0; i < lens.cameras.size(); ++i) {
    const Camera& c = lens.cameras[i];
    ASSERT_EQ(c.camera_to_world, pinhole.cameras[i].camera_to_world);
    ASSERT_EQ(c.fx, pinhole.cameras[i].fx);
    ASSERT_TRUE(has_distortion(c));
    const torch::Tensor want = composited(pinhole, i);
    const torch::Tensor raw = composited(lens, i);
    const torch::Tensor fixed = undistort_image(raw, c);
    auto interior = [&](const torch::Tensor& t) {
      return t.narrow(0, kMargin, kSize - 2 * kMargin).narrow(1, kMargin, kSize - 2 * kMargin);
    };
    undistorted_error += interior(fixed - want).abs().mean().item<double>() / lens.cameras.size();
    raw_error += interior(raw - want).abs().mean().item<double>() / lens.cameras.size();
  }
  std::printf("mean abs error over interior pixels: undistorted %.4f, raw %.4f\n",
              undistorted_error, raw_error);
  // What remains after undistortion is the blur of bilinear resampling at the sharp texture edges
  // (measured 0.0060, i.e. 1.5 levels of 255 on average); 0.01 leaves a margin. The raw render,
  // measured 0.0316, is 5x worse; 3x is asked for.
  EXPECT_LE(undistorted_error, 0.01);
  EXPECT_GE(raw_error, 3 * undistorted_error);
}

// ---- tessera synth --distortion ---------------------------------------------------------------

TEST(SynthLens, CameraRayAndProjectGoThroughTheLens) {
  synth::SynthOptions options;
  options.views = 4;
  options.width = 64, options.height = 40;
  options.distortion = {0.0578, -0.0805, -0.00098, 0.000156};
  const synth::SynthScene scene = synth::build_scene(options);
  synth::Rng rng(3, 0);
  for (const Camera& c : scene.cameras) {
    EXPECT_EQ(c.k1, 0.0578);
    EXPECT_EQ(c.p2, 0.000156);
    for (int i = 0; i < 50; ++i) {
      const double px = rng.uniform(0, c.width), py = rng.uniform(0, c.height);
      const synth::Vec3 p = synth::camera_ray(c, px, py).at(rng.uniform(0.5, 5));
      double u, v;
      ASSERT_TRUE(synth::project(c, p, &u, &v));
      EXPECT_NEAR(u, px, 1e-9);
      EXPECT_NEAR(v, py, 1e-9);
      // project agrees with the reference model on the camera-space point.
      const auto& m = c.camera_to_world;
      const synth::Vec3 q = p - synth::Vec3{m[3], m[7], m[11]};
      double ru, rv;
      reference_project(c, m[0] * q.x + m[4] * q.y + m[8] * q.z,
                        m[1] * q.x + m[5] * q.y + m[9] * q.z,
                        m[2] * q.x + m[6] * q.y + m[10] * q.z, &ru, &rv);
      EXPECT_NEAR(u, ru, 1e-9);
      EXPECT_NEAR(v, rv, 1e-9);
    }
  }
}

TEST(SynthLens, RoomNearStaysBelowEveryDepthWithABarrelLens) {
  // Barrel distortion widens the view; near must still bound the depth of all that is seen.
  synth::SynthOptions options;
  options.preset = "room";
  options.views = 8;
  options.width = options.height = 32;
  options.distortion = {-0.3, 0.05, 0, 0};
  const synth::SynthScene scene = synth::build_scene(options);
  for (const Camera& c : scene.cameras) {
    const synth::Vec3 forward{c.camera_to_world[2], c.camera_to_world[6], c.camera_to_world[10]};
    const double w = c.width, h = c.height;
    for (double t = 0; t <= 1.0; t += 1.0 / 64)
      for (const auto& [px, py] : {std::pair{t * w, 0.0}, std::pair{t * w, h},
                                   std::pair{0.0, t * h}, std::pair{w, t * h}}) {
        const synth::Ray ray = synth::camera_ray(c, px, py);
        const synth::SurfaceHit hit = synth::trace(scene, ray);
        ASSERT_GE(hit.shape, 0);
        EXPECT_GE(synth::dot(hit.point - ray.origin, forward), scene.meta.near);
      }
  }
}

TEST(SynthLens, RefusesDistortionsThatCannotBeUndistorted) {
  synth::SynthOptions options;
  options.distortion = {0.0578, -0.0805, -0.00098, 0.000156};
  EXPECT_NO_THROW(synth::validate_options(options));
  for (const std::array<double, 4>& bad :
       {std::array<double, 4>{NAN, 0, 0, 0}, std::array<double, 4>{0, 0, INFINITY, 0},
        std::array<double, 4>{-1.0, 0, 0, 0}, std::array<double, 4>{-0.6, -0.6, 0, 0}}) {
    options.distortion = bad;
    try {
      synth::validate_options(options);
      ADD_FAILURE() << "accepted " << bad[0] << "," << bad[1] << "," << bad[2] << "," << bad[3];
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("--distortion"), std::string::npos) << e.what();
    }
  }
}

// Runs the `tessera` binary with `args`; returns the exit code and fills `err` with stderr.
int run_tessera(const std::string& args, std::string* err) {
  const std::string scratch = std::filesystem::temp_directory_path() /
                              ("tessera_lens_" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  const test::CommandResult r =
      test::run_shell(std::string(std::getenv("TESSERA_BINARY")) + " " + args, scratch);
  test::remove_tree(scratch);
  *err = r.err;
  return r.exit_code;
}

TEST(SynthLens, BinaryWritesDistortedCamerasAndRefusesBadValues) {
  if (!std::getenv("TESSERA_BINARY")) GTEST_SKIP() << "TESSERA_BINARY not set (run under CTest)";
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("tessera_lens_" + std::to_string(::getpid()) + ".h5"))
                              .string();
  std::string err;
  ASSERT_EQ(run_tessera("synth --out " + out + " --views 3 --width 16 --height 16 "
                        "--distortion -0.1,0.01,0.001,-0.002", &err), 0)
      << err;
  {
    const SceneReader reader(out);
    for (const Camera& c : reader.cameras()) {
      EXPECT_EQ(c.k1, -0.1);
      EXPECT_EQ(c.k2, 0.01);
      EXPECT_EQ(c.p1, 0.001);
      EXPECT_EQ(c.p2, -0.002);
    }
    EXPECT_NE(reader.meta().source.find("distortion=-0.1,0.01,0.001,-0.002"), std::string::npos)
        << reader.meta().source;
  }
  test::remove_tree(out);
  for (const char* bad : {"--distortion 0.1,0.2,0.3", "--distortion 0.1,0.2,0.3,0.4,0.5",
                          "--distortion=abc,0,0,0", "--distortion nan,0,0,0",
                          "--distortion=-1,0,0,0", "--distortion 0.1,,0,0"}) {
    EXPECT_EQ(run_tessera("synth --out " + out + " --views 3 " + bad, &err), 2) << bad << err;
    EXPECT_NE(err.find("--distortion"), std::string::npos) << bad << err;
    EXPECT_FALSE(std::filesystem::exists(out)) << bad;
  }
}

}  // namespace
}  // namespace tessera::data
