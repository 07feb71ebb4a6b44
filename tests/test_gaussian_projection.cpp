// Tests of kernels::project_gaussians against the plain-LibTorch reference (autograd for the
// gradients): values, gradients, culling, finite differences, invariants, bad input, CUDA vs CPU.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "kernels/gaussian_projection.h"
#include "kernels/gaussian_projection_math.h"
#include "kernels/nonfinite.h"
#include "tests/expect_close.h"
#include "tests/reference/gaussian_projection_reference.h"
#include "tests/cuda_skip.h"

namespace tessera::kernels {
namespace {

// Tolerances: |actual - expected| <= kRtol * |expected| + kAtol * scale, with scale the largest
// |expected| of the tensor (at least 1). The op and the reference evaluate the same formulas in
// the same dtype but in another order (3x3 products by hand vs batched matmul, the conic's
// gradient in closed form vs through autograd), so they differ by rounding, amplified by the
// conditioning of the 2D covariance inverse (elongated Gaussians): ~1e-14 relative in float64,
// ~1e-5 in float32.
constexpr double kRtol64 = 1e-10, kAtol64 = 1e-12;
constexpr double kRtol32 = 1e-4, kAtol32 = 1e-5;

using test::expect_close;

struct Camera {
  torch::Tensor viewmat;  // [4, 4] float64
  double fx = 520, fy = 480, cx = 321.5, cy = 238.25;
  int64_t width = 640, height = 480;
  double near_plane = 0.01, far_plane = 1e10, eps2d = 0.3;
};

struct Gaussians {
  torch::Tensor means, quats, scales;  // [N, 3], [N, 4], [N, 3]
};

// A camera looking at the origin from a random direction, with a random roll.
Camera make_camera(uint64_t seed) {
  torch::manual_seed(seed);
  const auto f64 = torch::dtype(torch::kFloat64);
  // A random rotation from the QR decomposition of a Gaussian matrix (sign-fixed to det +1).
  auto [q, r] = torch::linalg_qr(torch::randn({3, 3}, f64));
  q = q * torch::sign(torch::diagonal(r)).unsqueeze(0);
  if (torch::det(q).item<double>() < 0) q.select(1, 0).neg_();
  Camera cam;
  cam.viewmat = torch::eye(4, f64);
  cam.viewmat.slice(0, 0, 3).slice(1, 0, 3).copy_(q);
  cam.viewmat.slice(0, 0, 3).select(1, 3).copy_(torch::tensor({0.3, -0.2, 4.0}, f64));
  return cam;
}

// Gaussians placed in camera space, then mapped to world space: most in view at depth 0.5..12,
// and a share of each culled kind and of edge cases:
//   kind 0: in view;  1: behind the camera or the near plane;  2: off the image (small, far to a
//   side);  3: large and beside the view, beyond the 1.3 x fov clamp but reaching into the image
//   (the clamped Jacobian);  4: tiny (sub-pixel, the eps2d blur dominates).
// Quaternions are random and not unit; scales log-uniform.
Gaussians make_gaussians(int64_t n, const Camera& cam, torch::ScalarType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double tan_x = 0.5 * cam.width / cam.fx, tan_y = 0.5 * cam.height / cam.fy;
  std::vector<double> cam_points(3 * n), quats(4 * n), scales(3 * n);
  for (int64_t i = 0; i < n; ++i) {
    const double kind = unit(rng);
    double z = 0.5 + 11.5 * unit(rng);
    double rx = (2 * unit(rng) - 1) * 1.1 * tan_x, ry = (2 * unit(rng) - 1) * 1.1 * tan_y;
    double log_scale = std::log(0.01) + (std::log(0.6) - std::log(0.01)) * unit(rng);
    if (kind < 0.1) {
      z = -3.0 + 3.005 * unit(rng);  // [-3, 0.005): behind the near plane (0.01)
    } else if (kind < 0.2) {
      rx = (unit(rng) < 0.5 ? -1 : 1) * (2.0 + unit(rng)) * tan_x;
      log_scale = std::log(0.002);
    } else if (kind < 0.3) {
      z = 1.0 + unit(rng);
      rx = (unit(rng) < 0.5 ? -1 : 1) * (1.35 + 0.2 * unit(rng)) * tan_x;
      ry = (unit(rng) < 0.5 ? -1 : 1) * (1.35 + 0.2 * unit(rng)) * tan_y * (unit(rng) < 0.5);
      log_scale = std::log(0.8 + 0.5 * unit(rng));
    } else if (kind < 0.35) {
      log_scale = std::log(1e-4);
    }
    cam_points[3 * i + 0] = rx * z;
    cam_points[3 * i + 1] = ry * z;
    cam_points[3 * i + 2] = z;
    const double magnitude = 0.3 + 2.0 * unit(rng);
    double norm = 0;
    for (int k = 0; k < 4; ++k) {
      quats[4 * i + k] = normal(rng);
      norm += quats[4 * i + k] * quats[4 * i + k];
    }
    for (int k = 0; k < 4; ++k) quats[4 * i + k] *= magnitude / std::sqrt(norm);
    for (int k = 0; k < 3; ++k) scales[3 * i + k] = std::exp(log_scale + 0.7 * normal(rng));
  }
  const auto f64 = torch::dtype(torch::kFloat64);
  const torch::Tensor p = torch::tensor(cam_points, f64).view({n, 3});
  const torch::Tensor W = cam.viewmat.slice(0, 0, 3).slice(1, 0, 3);
  const torch::Tensor t = cam.viewmat.slice(0, 0, 3).select(1, 3);
  Gaussians g;
  g.means = torch::matmul(p - t, W).to(dtype);  // W^T (p - t), row-wise
  g.quats = torch::tensor(quats, f64).view({n, 4}).to(dtype);
  g.scales = torch::tensor(scales, f64).view({n, 3}).to(dtype);
  return g;
}

// Random cotangents for the three float outputs; a missing one stays undefined.
struct Cotangents {
  torch::Tensor means2d, depths, conics;
};

Cotangents random_cotangents(int64_t n, torch::ScalarType dtype, uint64_t seed,
                             bool means2d = true, bool depths = true, bool conics = true) {
  torch::manual_seed(seed);
  const auto opts = torch::dtype(dtype);
  Cotangents c;
  if (means2d) c.means2d = torch::randn({n, 2}, opts);
  if (depths) c.depths = torch::randn({n}, opts);
  if (conics) c.conics = torch::randn({n, 3}, opts);
  return c;
}

template <typename Out>
torch::Tensor loss_of(const Out& out, const Cotangents& c) {
  torch::Tensor loss = torch::zeros({}, out.means2d.options());
  if (c.means2d.defined()) loss = loss + (out.means2d * c.means2d).sum();
  if (c.depths.defined()) loss = loss + (out.depths * c.depths).sum();
  if (c.conics.defined()) loss = loss + (out.conics * c.conics).sum();
  return loss;
}

struct Grads {
  torch::Tensor v_means, v_quats, v_scales;
};

// Forward outputs of `project` and the gradients of <outputs, cotangents>.
template <typename Out, typename Project>
std::pair<Out, Grads> run_with_grads(Project project, const Gaussians& g, const Camera& cam,
                                     const Cotangents& c) {
  const torch::Tensor means = g.means.detach().clone().requires_grad_(true);
  const torch::Tensor quats = g.quats.detach().clone().requires_grad_(true);
  const torch::Tensor scales = g.scales.detach().clone().requires_grad_(true);
  const torch::Tensor viewmat = cam.viewmat.to(g.means.options());
  Out out = project(means, quats, scales, viewmat, cam);
  const torch::Tensor loss = loss_of(out, c);
  Grads grads;
  const auto grad = [](const torch::Tensor& t) {
    return t.grad().defined() ? t.grad() : torch::zeros_like(t);
  };
  if (loss.requires_grad()) loss.backward();
  grads.v_means = grad(means);
  grads.v_quats = grad(quats);
  grads.v_scales = grad(scales);
  return {out, grads};
}

ProjectionOutput op_project(const torch::Tensor& means, const torch::Tensor& quats,
                            const torch::Tensor& scales, const torch::Tensor& viewmat,
                            const Camera& c) {
  return project_gaussians(means, quats, scales, viewmat, c.fx, c.fy, c.cx, c.cy, c.width,
                           c.height, c.near_plane, c.far_plane, c.eps2d);
}

test::ReferenceProjection ref_project(const torch::Tensor& means, const torch::Tensor& quats,
                                      const torch::Tensor& scales, const torch::Tensor& viewmat,
                                      const Camera& c) {
  return test::reference_project_gaussians(means, quats, scales, viewmat, c.fx, c.fy, c.cx, c.cy,
                                           c.width, c.height, c.near_plane, c.far_plane, c.eps2d);
}

// True where the reference's 3 sqrt(lambda) lies within `slack` (relative) of an integer: the
// ceil may then round either way in the op's order of operations.
torch::Tensor near_ceil_boundary(const test::ReferenceProjection& ref, double slack) {
  const torch::Tensor r = ref.radius_before_ceil.to(torch::kFloat64);
  const torch::Tensor frac = r - torch::floor(r);
  return torch::minimum(frac, 1 - frac) <= slack * torch::clamp_min(r, 1.0);
}

// Radii must be equal, except at ceil boundaries. Returns the mask of Gaussians whose radius
// (and so their culling) agree, for the other comparisons.
torch::Tensor expect_radii_equal(const torch::Tensor& radii, const test::ReferenceProjection& ref,
                                 double slack, const std::string& what) {
  EXPECT_EQ(radii.scalar_type(), torch::kInt32) << what;
  const torch::Tensor same = radii.cpu() == ref.radii;
  EXPECT_EQ((~same & ~near_ceil_boundary(ref, slack)).sum().item<int64_t>(), 0)
      << what << ": radii differ away from a ceil boundary";
  return same;
}

// Compares the op with the reference on one scene: radii, values and the three gradients.
void compare_to_reference(int64_t n, const Camera& cam, torch::ScalarType dtype, uint64_t seed,
                          const Cotangents& c, const std::string& what) {
  const double rtol = dtype == torch::kFloat32 ? kRtol32 : kRtol64;
  const double atol = dtype == torch::kFloat32 ? kAtol32 : kAtol64;
  const double slack = dtype == torch::kFloat32 ? 1e-5 : 1e-12;
  const Gaussians g = make_gaussians(n, cam, dtype, seed);
  const auto [ref, ref_grads] =
      run_with_grads<test::ReferenceProjection>(ref_project, g, cam, c);
  const auto [out, grads] = run_with_grads<ProjectionOutput>(op_project, g, cam, c);
  const torch::Tensor same = expect_radii_equal(out.radii, ref, slack, what);
  // A Gaussian culled on one side only (a ceil boundary at the image edge) is left out.
  const auto keep = [&](const torch::Tensor& t) {
    const torch::Tensor m = same.to(t.scalar_type());
    return t * (t.dim() == 1 ? m : m.view({-1, 1}));
  };
  expect_close(keep(out.means2d), keep(ref.means2d), rtol, atol, what + " means2d");
  expect_close(keep(out.depths), keep(ref.depths), rtol, atol, what + " depths");
  expect_close(keep(out.conics), keep(ref.conics), rtol, atol, what + " conics");
  expect_close(keep(grads.v_means), keep(ref_grads.v_means), rtol, atol, what + " v_means");
  expect_close(keep(grads.v_quats), keep(ref_grads.v_quats), rtol, atol, what + " v_quats");
  expect_close(keep(grads.v_scales), keep(ref_grads.v_scales), rtol, atol, what + " v_scales");
  // Culled Gaussians: zero outputs and zero gradient, exactly.
  const torch::Tensor culled = (out.radii == 0).view({-1, 1});
  for (const torch::Tensor* t : {&out.means2d, &out.conics, &grads.v_means, &grads.v_quats,
                                 &grads.v_scales})
    EXPECT_EQ((t->abs() * culled).sum().item<double>(), 0.0) << what << " culled not zero";
  EXPECT_EQ((out.depths.abs() * culled.view(-1)).sum().item<double>(), 0.0) << what;
}

const std::vector<int64_t> kSizes = {0, 1, 7, 100, 3000};

TEST(GaussianProjection, MatchesReferenceFloat64) {
  uint64_t seed = 100;
  for (int64_t n : kSizes) {
    const Camera cam = make_camera(seed++);
    const Cotangents c = random_cotangents(n, torch::kFloat64, seed++);
    compare_to_reference(n, cam, torch::kFloat64, seed++, c, "float64 N=" + std::to_string(n));
  }
}

TEST(GaussianProjection, MatchesReferenceFloat32) {
  uint64_t seed = 200;
  for (int64_t n : kSizes) {
    const Camera cam = make_camera(seed++);
    const Cotangents c = random_cotangents(n, torch::kFloat32, seed++);
    compare_to_reference(n, cam, torch::kFloat32, seed++, c, "float32 N=" + std::to_string(n));
  }
}

// Each output alone: the other grad outputs reach backward undefined and must count as zero.
TEST(GaussianProjection, GradientOfEachOutputAlone) {
  const Camera cam = make_camera(301);
  const int64_t n = 500;
  for (int mask = 1; mask < 8; ++mask) {
    const Cotangents c =
        random_cotangents(n, torch::kFloat64, 310 + mask, mask & 1, mask & 2, mask & 4);
    compare_to_reference(n, cam, torch::kFloat64, 302, c, "mask " + std::to_string(mask));
  }
}

// The scenes exercise every branch: each kind of culling, visible Gaussians beyond the clamp.
TEST(GaussianProjection, ScenesCoverCullingAndClamp) {
  const Camera cam = make_camera(401);
  const Gaussians g = make_gaussians(3000, cam, torch::kFloat64, 402);
  const auto out = op_project(g.means, g.quats, g.scales, cam.viewmat, cam);
  const torch::Tensor W = cam.viewmat.slice(0, 0, 3).slice(1, 0, 3);
  const torch::Tensor p = torch::matmul(g.means, W.t()) + cam.viewmat.slice(0, 0, 3).select(1, 3);
  const torch::Tensor z = p.select(1, 2);
  const torch::Tensor rx = (p.select(1, 0) / z).abs();
  const torch::Tensor visible = out.radii > 0;
  const double lim_x = 1.3 * 0.5 * cam.width / cam.fx;
  EXPECT_GT((z < cam.near_plane).sum().item<int64_t>(), 100);
  EXPECT_EQ((visible & (z < cam.near_plane)).sum().item<int64_t>(), 0);
  EXPECT_GT((~visible & (z > cam.near_plane)).sum().item<int64_t>(), 100);  // off the image
  EXPECT_GT((visible & (z > 0) & (rx > lim_x)).sum().item<int64_t>(), 20);  // clamped Jacobian
  EXPECT_GT(visible.sum().item<int64_t>(), 1500);
}

// Each cull rule on its own, with zero outputs and zero gradients; a visible Gaussian beside
// them gets non-zero gradient.
TEST(GaussianProjection, CulledGaussiansGetZeroOutputsAndGradients) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto opts = torch::dtype(dtype);
    Camera cam;
    cam.viewmat = torch::eye(4, torch::kFloat64);
    cam.far_plane = 100;
    const torch::Tensor means = torch::tensor({0.0, 0.0, 5.0,      // visible
                                               0.0, 0.0, -1.0,     // behind the camera
                                               0.0, 0.0, 0.005,    // in front of the near plane
                                               0.0, 0.0, 150.0,    // beyond the far plane
                                               20.0, 0.0, 5.0,     // off the image (right)
                                               0.0, -15.0, 5.0,    // off the image (top)
                                               0.0, 0.0, 5.0},     // degenerate (see below)
                                              opts).view({7, 3});
    const torch::Tensor quats = torch::tensor({1.0, 0.0, 0.0, 0.0}, opts).repeat({7, 1});
    torch::Tensor scales = torch::full({7, 3}, 0.05, opts);
    scales[6] = torch::tensor({0.5, 0.0, 0.0}, opts);  // a line along x: rank-1 2D covariance
    for (double eps2d : {0.3, 0.0}) {
      cam.eps2d = eps2d;
      const Gaussians g{means, quats, scales};
      const Cotangents c = random_cotangents(7, dtype, 501);
      const auto [out, grads] = run_with_grads<ProjectionOutput>(op_project, g, cam, c);
      const std::vector<int32_t> expected_radii = {
          static_cast<int32_t>(std::ceil(3 * std::sqrt(std::pow(cam.fx * 0.05 / 5, 2) + eps2d))),
          0, 0, 0, 0, 0, eps2d > 0 ? 1 : 0};
      for (int i = 0; i < 7; ++i) {
        const int32_t r = out.radii[i].item<int32_t>();
        if (i == 6 && eps2d > 0) {
          EXPECT_GT(r, 0) << "blurred line is visible";
          continue;
        }
        EXPECT_EQ(r, expected_radii[i]) << "Gaussian " << i << " eps2d " << eps2d;
        if (r == 0) {
          EXPECT_EQ(out.means2d[i].abs().sum().item<double>(), 0.0) << i;
          EXPECT_EQ(out.depths[i].item<double>(), 0.0) << i;
          EXPECT_EQ(out.conics[i].abs().sum().item<double>(), 0.0) << i;
          EXPECT_EQ(grads.v_means[i].abs().sum().item<double>(), 0.0) << i;
          EXPECT_EQ(grads.v_quats[i].abs().sum().item<double>(), 0.0) << i;
          EXPECT_EQ(grads.v_scales[i].abs().sum().item<double>(), 0.0) << i;
        }
      }
      EXPECT_GT(grads.v_means[0].abs().sum().item<double>(), 0.0);
      EXPECT_GT(grads.v_scales[0].abs().sum().item<double>(), 0.0);
      EXPECT_TRUE(torch::equal(out.radii, ref_project(means, quats, scales,
                                                      cam.viewmat.to(dtype), cam).radii));
    }
  }
}

// A Gaussian on the optical axis with an isotropic scale s at depth z: the 2D covariance is
// (fx s / z)^2 + eps2d on x, (fy s / z)^2 + eps2d on y, no correlation.
TEST(GaussianProjection, HandComputedIsotropicGaussian) {
  Camera cam;
  cam.viewmat = torch::eye(4, torch::kFloat64);
  cam.viewmat[2][3] = 2.0;  // camera 2 units behind the world origin
  const double s = 0.1, z = 5.0;
  const torch::Tensor means = torch::tensor({{0.0, 0.0, z - 2.0}}, torch::kFloat64);
  const torch::Tensor quats = torch::tensor({{0.0, 0.0, 0.0, -2.5}}, torch::kFloat64);  // 180 deg
  const torch::Tensor scales = torch::full({1, 3}, s, torch::kFloat64);
  const auto out = op_project(means, quats, scales, cam.viewmat, cam);
  const double a = std::pow(cam.fx * s / z, 2) + cam.eps2d;
  const double c = std::pow(cam.fy * s / z, 2) + cam.eps2d;
  EXPECT_NEAR(out.means2d[0][0].item<double>(), cam.cx, 1e-12);
  EXPECT_NEAR(out.means2d[0][1].item<double>(), cam.cy, 1e-12);
  EXPECT_NEAR(out.depths[0].item<double>(), z, 1e-12);
  EXPECT_NEAR(out.conics[0][0].item<double>(), 1 / a, 1e-12);
  EXPECT_NEAR(out.conics[0][1].item<double>(), 0.0, 1e-12);
  EXPECT_NEAR(out.conics[0][2].item<double>(), 1 / c, 1e-12);
  EXPECT_EQ(out.radii[0].item<int32_t>(), static_cast<int32_t>(std::ceil(3 * std::sqrt(a))));
}

// A splat whose 3-sigma radius is beyond int32 (scale 1e8 in front of the camera) keeps a positive
// radius, clamped to kMaxRadius, in both dtypes: the cast of the unclamped float was undefined.
TEST(GaussianProjection, HugeRadiusIsClampedNotWrapped) {
  Camera cam;
  cam.viewmat = torch::eye(4, torch::kFloat64);
  for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const torch::Tensor means = torch::tensor({{0.0, 0.0, 5.0}, {0.1, 0.0, 4.0}}, dtype);
    const torch::Tensor quats = torch::tensor({{1.0, 0.0, 0.0, 0.0}, {1.0, 0.0, 0.0, 0.0}}, dtype);
    const torch::Tensor scales = torch::tensor({{1e8, 1e8, 1e8}, {0.1, 0.1, 0.1}}, dtype);
    const auto out = op_project(means, quats, scales, cam.viewmat.to(dtype), cam);
    EXPECT_EQ(out.radii[0].item<int32_t>(), projection_math::kMaxRadius) << dtype;
    EXPECT_GT(out.radii[1].item<int32_t>(), 0) << dtype;
    EXPECT_LT(out.radii[1].item<int32_t>(), 1000) << dtype;
    EXPECT_NEAR(out.means2d[0][0].item<double>(), cam.cx, 1e-3) << dtype;
  }
}

// Central finite differences in float64 of L = <outputs, cotangents> against the op's backward,
// for Gaussians inside the view and beyond the Jacobian clamp (a few hundred pixels wide).
TEST(GaussianProjection, FiniteDifferencesFloat64) {
  const Camera cam = make_camera(601);
  const auto f64 = torch::dtype(torch::kFloat64);
  const torch::Tensor W = cam.viewmat.slice(0, 0, 3).slice(1, 0, 3);
  const torch::Tensor t = cam.viewmat.slice(0, 0, 3).select(1, 3);
  const double tan_x = 0.5 * cam.width / cam.fx;
  // Camera-space centres: in view, off-axis, and at 1.4 x tan_fovx (clamped) but large.
  const torch::Tensor p = torch::tensor({0.1, -0.2, 3.0, -1.5, 0.8, 6.0,
                                         1.4 * tan_x * 1.5, 0.3, 1.5}, f64).view({3, 3});
  Gaussians g;
  g.means = torch::matmul(p - t, W);
  g.quats = torch::tensor({0.9, 0.3, -0.4, 0.2, -0.5, 1.2, 0.1, 0.7, 0.3, 0.3, 0.8, -0.2}, f64)
                .view({3, 4});
  g.scales = torch::tensor({0.05, 0.2, 0.1, 0.3, 0.02, 0.15, 1.0, 0.6, 0.8}, f64).view({3, 3});
  const Cotangents c = random_cotangents(3, torch::kFloat64, 602);
  const auto [out, grads] = run_with_grads<ProjectionOutput>(op_project, g, cam, c);
  ASSERT_TRUE((out.radii > 0).all().item<bool>());
  const auto loss = [&](const Gaussians& h) {
    torch::NoGradGuard no_grad;
    return loss_of(op_project(h.means, h.quats, h.scales, cam.viewmat, cam), c).item<double>();
  };
  constexpr double kStep = 1e-6;
  const char* names[] = {"means", "quats", "scales"};
  const torch::Tensor analytic[] = {grads.v_means, grads.v_quats, grads.v_scales};
  for (int which = 0; which < 3; ++which) {
    for (int64_t k = 0; k < analytic[which].numel(); ++k) {
      Gaussians plus{g.means.clone(), g.quats.clone(), g.scales.clone()};
      Gaussians minus{g.means.clone(), g.quats.clone(), g.scales.clone()};
      torch::Tensor* tp[] = {&plus.means, &plus.quats, &plus.scales};
      torch::Tensor* tm[] = {&minus.means, &minus.quats, &minus.scales};
      tp[which]->view(-1)[k] += kStep;
      tm[which]->view(-1)[k] -= kStep;
      const double numeric = (loss(plus) - loss(minus)) / (2 * kStep);
      const double a = analytic[which].view(-1)[k].item<double>();
      EXPECT_NEAR(a, numeric, 1e-6 + 1e-6 * std::abs(numeric)) << names[which] << "[" << k << "]";
    }
  }
}

// Outputs depend on the quaternion's direction only; its gradient scales with 1 / |q|.
TEST(GaussianProjection, QuaternionScaleInvariance) {
  const Camera cam = make_camera(701);
  const Gaussians g = make_gaussians(200, cam, torch::kFloat64, 702);
  const Gaussians g2{g.means, g.quats * 3.5, g.scales};
  const Cotangents c = random_cotangents(200, torch::kFloat64, 703);
  const auto [a, ga] = run_with_grads<ProjectionOutput>(op_project, g, cam, c);
  const auto [b, gb] = run_with_grads<ProjectionOutput>(op_project, g2, cam, c);
  EXPECT_TRUE(torch::equal(a.radii, b.radii));
  expect_close(b.conics, a.conics, kRtol64, kAtol64, "conics");
  expect_close(gb.v_means, ga.v_means, kRtol64, kAtol64, "v_means");
  expect_close(gb.v_quats * 3.5, ga.v_quats, kRtol64, kAtol64, "v_quats");
  // The gradient is tangent to the sphere of quaternions: orthogonal to q.
  const torch::Tensor radial = (ga.v_quats * g.quats).sum(1);
  EXPECT_LT(radial.abs().max().item<double>(), 1e-10 * (1 + ga.v_quats.abs().max().item<double>()));
}

// The test must be able to fail: the reference with another eps2d is told apart.
TEST(GaussianProjection, ReferenceComparisonDetectsADifferentBlur) {
  Camera cam = make_camera(801);
  const Gaussians g = make_gaussians(300, cam, torch::kFloat64, 802);
  const auto out = op_project(g.means, g.quats, g.scales, cam.viewmat, cam);
  cam.eps2d = 0.0;
  const auto ref = ref_project(g.means, g.quats, g.scales, cam.viewmat, cam);
  EXPECT_GT((out.conics - ref.conics).abs().max().item<double>(), 1e-3);
}

TEST(GaussianProjection, EmptyInputs) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto opts = torch::dtype(dtype);
    const torch::Tensor means = torch::zeros({0, 3}, opts).requires_grad_(true);
    const torch::Tensor quats = torch::zeros({0, 4}, opts).requires_grad_(true);
    const torch::Tensor scales = torch::zeros({0, 3}, opts).requires_grad_(true);
    const auto out = project_gaussians(means, quats, scales, torch::eye(4, opts), 500, 500, 320,
                                       240, 640, 480);
    EXPECT_EQ(out.radii.sizes(), (std::vector<int64_t>{0}));
    EXPECT_EQ(out.radii.scalar_type(), torch::kInt32);
    EXPECT_EQ(out.means2d.sizes(), (std::vector<int64_t>{0, 2}));
    EXPECT_EQ(out.depths.sizes(), (std::vector<int64_t>{0}));
    EXPECT_EQ(out.conics.sizes(), (std::vector<int64_t>{0, 3}));
    (out.means2d.sum() + out.depths.sum() + out.conics.sum()).backward();
    EXPECT_EQ(means.grad().sizes(), (std::vector<int64_t>{0, 3}));
    EXPECT_EQ(quats.grad().sizes(), (std::vector<int64_t>{0, 4}));
  }
}

TEST(GaussianProjection, NonContiguousInputsMatchContiguous) {
  const Camera cam = make_camera(901);
  const Gaussians g = make_gaussians(300, cam, torch::kFloat32, 902);
  const auto strided = [](const torch::Tensor& t) {
    return torch::stack({t, torch::zeros_like(t)}, 2).select(2, 0);
  };
  ASSERT_FALSE(strided(g.means).is_contiguous());
  const torch::Tensor view = cam.viewmat.to(torch::kFloat32);
  const auto a = op_project(strided(g.means), strided(g.quats), strided(g.scales),
                            view.t().contiguous().t(), cam);
  const auto b = op_project(g.means, g.quats, g.scales, view, cam);
  EXPECT_TRUE(torch::equal(a.radii, b.radii));
  EXPECT_TRUE(torch::equal(a.means2d, b.means2d));
  EXPECT_TRUE(torch::equal(a.conics, b.conics));
}

// The CPU backward gives bitwise the same gradients for any thread count.
TEST(GaussianProjection, BackwardIsDeterministicAcrossThreadCounts) {
  const Camera cam = make_camera(1001);
  const Gaussians g = make_gaussians(20000, cam, torch::kFloat32, 1002);
  const Cotangents c = random_cotangents(20000, torch::kFloat32, 1003);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto [a, ga] = run_with_grads<ProjectionOutput>(op_project, g, cam, c);
  at::set_num_threads(std::max(2, threads));
  const auto [b, gb] = run_with_grads<ProjectionOutput>(op_project, g, cam, c);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(ga.v_means, gb.v_means));
  EXPECT_TRUE(torch::equal(ga.v_quats, gb.v_quats));
  EXPECT_TRUE(torch::equal(ga.v_scales, gb.v_scales));
}

TEST(GaussianProjection, WorksWithoutGradMode) {
  const Camera cam = make_camera(1101);
  const Gaussians g = make_gaussians(10, cam, torch::kFloat32, 1102);
  torch::NoGradGuard no_grad;
  const auto out = op_project(g.means.requires_grad_(true), g.quats, g.scales,
                              cam.viewmat.to(torch::kFloat32), cam);
  EXPECT_FALSE(out.means2d.requires_grad());
}

TEST(GaussianProjection, RejectsBadInput) {
  const auto opts = torch::dtype(torch::kFloat32);
  const torch::Tensor m = torch::rand({4, 3}, opts), q = torch::rand({4, 4}, opts),
                      s = torch::rand({4, 3}, opts), v = torch::eye(4, opts);
  const auto project = [](const torch::Tensor& m, const torch::Tensor& q, const torch::Tensor& s,
                          const torch::Tensor& v, double fx = 500, int64_t width = 640,
                          double near_plane = 0.01, double far_plane = 100, double eps2d = 0.3) {
    return project_gaussians(m, q, s, v, fx, 500, 320, 240, width, 480, near_plane, far_plane,
                             eps2d);
  };
  EXPECT_THROW(project(m.view({3, 4}), q, s, v), c10::Error);
  EXPECT_THROW(project(m, q.slice(1, 0, 3), s, v), c10::Error);
  EXPECT_THROW(project(m, q.slice(0, 0, 3), s, v), c10::Error);
  EXPECT_THROW(project(m, q, s.slice(1, 0, 2), v), c10::Error);
  EXPECT_THROW(project(m, q, s, v.slice(0, 0, 3)), c10::Error);
  EXPECT_THROW(project(m, q, s.to(torch::kFloat64), v), c10::Error);
  EXPECT_THROW(project(m, q, s, v.to(torch::kFloat64)), c10::Error);
  EXPECT_THROW(project(m.to(torch::kInt32), q.to(torch::kInt32), s.to(torch::kInt32),
                       v.to(torch::kInt32)), c10::Error);
  EXPECT_THROW(project(m.to(torch::kFloat16), q.to(torch::kFloat16), s.to(torch::kFloat16),
                       v.to(torch::kFloat16)), c10::Error);
  EXPECT_THROW(project(m, q, s, v, -500), c10::Error);
  EXPECT_THROW(project(m, q, s, v, 500, 0), c10::Error);
  EXPECT_THROW(project(m, q, s, v, 500, 640, 0.0), c10::Error);
  EXPECT_THROW(project(m, q, s, v, 500, 640, 1.0, 0.5), c10::Error);
  EXPECT_THROW(project(m, q, s, v, 500, 640, 0.01, 100, -0.1), c10::Error);
  // viewmat gets no gradient: asking for one is an error, not a silent zero.
  EXPECT_THROW(project(m, q, s, v.clone().requires_grad_(true)), c10::Error);
  EXPECT_NO_THROW(project(m, q, s, v));
}

// --- CUDA ------------------------------------------------------------------------------------

TEST(GaussianProjectionCuda, MatchesCpuForwardAndBackward) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  uint64_t seed = 1200;
  std::vector<int64_t> sizes = kSizes;
  sizes.push_back(100000);  // many blocks
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const double rtol = dtype == torch::kFloat32 ? kRtol32 : kRtol64;
    const double atol = dtype == torch::kFloat32 ? kAtol32 : kAtol64;
    const double slack = dtype == torch::kFloat32 ? 1e-5 : 1e-12;
    for (int64_t n : sizes) {
      const std::string what = "cuda " + std::string(c10::toString(dtype)) + " N=" +
                                std::to_string(n);
      Camera cam = make_camera(seed++);
      const Gaussians g = make_gaussians(n, cam, dtype, seed++);
      const Cotangents c = random_cotangents(n, dtype, seed++);
      const auto [ref, ref_grads] =
          run_with_grads<test::ReferenceProjection>(ref_project, g, cam, c);
      const auto [cpu_out, cpu_grads] = run_with_grads<ProjectionOutput>(op_project, g, cam, c);
      const Gaussians gd{g.means.to(device), g.quats.to(device), g.scales.to(device)};
      Camera cam_d = cam;
      cam_d.viewmat = cam.viewmat.to(device);
      const Cotangents cd{c.means2d.to(device), c.depths.to(device), c.conics.to(device)};
      const auto [out, grads] = run_with_grads<ProjectionOutput>(op_project, gd, cam_d, cd);
      ASSERT_TRUE(out.means2d.is_cuda()) << what;
      ASSERT_TRUE(grads.v_means.is_cuda()) << what;
      // Radii against the CPU op, up to ceil boundaries (FMA contraction differs on the GPU).
      const torch::Tensor same = (out.radii.cpu() == cpu_out.radii);
      EXPECT_EQ((~same & ~near_ceil_boundary(ref, slack)).sum().item<int64_t>(), 0)
          << what << " radii";
      const torch::Tensor keep = same.view({-1, 1}).to(dtype);
      expect_close(out.means2d.cpu() * keep, cpu_out.means2d * keep, rtol, atol, what + " means2d");
      expect_close(out.depths.cpu() * keep.view(-1), cpu_out.depths * keep.view(-1), rtol, atol,
                   what + " depths");
      expect_close(out.conics.cpu() * keep, cpu_out.conics * keep, rtol, atol, what + " conics");
      expect_close(grads.v_means.cpu() * keep, cpu_grads.v_means * keep, rtol, atol,
                   what + " v_means");
      expect_close(grads.v_quats.cpu() * keep, cpu_grads.v_quats * keep, rtol, atol,
                   what + " v_quats");
      expect_close(grads.v_scales.cpu() * keep, cpu_grads.v_scales * keep, rtol, atol,
                   what + " v_scales");
    }
  }
}

TEST(GaussianProjectionCuda, PartialCotangentsAndEmptyInputs) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  Camera cam = make_camera(1301);
  const Gaussians g = make_gaussians(500, cam, torch::kFloat64, 1302);
  const Gaussians gd{g.means.to(device), g.quats.to(device), g.scales.to(device)};
  Camera cam_d = cam;
  cam_d.viewmat = cam.viewmat.to(device);
  for (int mask = 1; mask < 8; mask <<= 1) {
    const Cotangents c = random_cotangents(500, torch::kFloat64, 1310 + mask, mask & 1, mask & 2,
                                           mask & 4);
    const Cotangents cd{c.means2d.defined() ? c.means2d.to(device) : c.means2d,
                        c.depths.defined() ? c.depths.to(device) : c.depths,
                        c.conics.defined() ? c.conics.to(device) : c.conics};
    const auto [ref, ref_grads] = run_with_grads<ProjectionOutput>(op_project, g, cam, c);
    const auto [out, grads] = run_with_grads<ProjectionOutput>(op_project, gd, cam_d, cd);
    const std::string what = "cuda mask " + std::to_string(mask);
    expect_close(grads.v_means.cpu(), ref_grads.v_means, kRtol64, kAtol64, what + " v_means");
    expect_close(grads.v_quats.cpu(), ref_grads.v_quats, kRtol64, kAtol64, what + " v_quats");
    expect_close(grads.v_scales.cpu(), ref_grads.v_scales, kRtol64, kAtol64, what + " v_scales");
  }
  const auto opts = torch::dtype(torch::kFloat32).device(device);
  const torch::Tensor means = torch::zeros({0, 3}, opts).requires_grad_(true);
  const auto out = project_gaussians(means, torch::zeros({0, 4}, opts), torch::zeros({0, 3}, opts),
                                     torch::eye(4, opts), 500, 500, 320, 240, 640, 480);
  EXPECT_EQ(out.conics.sizes(), (std::vector<int64_t>{0, 3}));
  (out.means2d.sum() + out.conics.sum()).backward();
  EXPECT_EQ(means.grad().sizes(), (std::vector<int64_t>{0, 3}));
}

}  // namespace
}  // namespace tessera::kernels
