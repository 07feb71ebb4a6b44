// Tests of kernels::spherical_harmonics against the plain-LibTorch reference (autograd for the
// gradients): degrees 0..3, values, gradients, clamping, finite differences, bad input, CUDA.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/nn/functional.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "kernels/nonfinite.h"
#include "kernels/spherical_harmonics.h"
#include "tests/expect_close.h"
#include "tests/reference/gaussian_projection_reference.h"
#include "tests/cuda_skip.h"

namespace tessera::kernels {
namespace {

// Tolerances: |actual - expected| <= kRtol * |expected| + kAtol * scale, with scale the largest
// |expected| of the tensor (at least 1). The op and the reference sum the same <= 16 products per
// channel in another order, so they differ by a few ulps of the largest term.
constexpr double kRtol64 = 1e-10, kAtol64 = 1e-12;
constexpr double kRtol32 = 1e-4, kAtol32 = 1e-5;

using test::expect_close;

struct Inputs {
  torch::Tensor dirs;    // [N, 3]
  torch::Tensor coeffs;  // [N, K, 3]
};

// Directions of random length (0.1..10) and coefficients around 0; the DC term is spread so that
// about a sixth of the channels fall below 0 and are clamped.
Inputs make_inputs(int64_t n, int64_t num_bases, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto opts = torch::dtype(torch::kFloat64);
  Inputs in;
  const torch::Tensor unit = torch::nn::functional::normalize(
      torch::randn({n, 3}, opts), torch::nn::functional::NormalizeFuncOptions().dim(1));
  in.dirs = (unit * torch::exp(torch::empty({n, 1}, opts).uniform_(std::log(0.1), std::log(10.0))))
                .to(dtype);
  in.coeffs = (0.4 * torch::randn({n, num_bases, 3}, opts)).to(dtype);
  in.coeffs.select(1, 0).copy_((2.0 * torch::randn({n, 3}, opts)).to(dtype));
  return in;
}

struct Result {
  torch::Tensor colors, v_dirs, v_coeffs;
};

template <typename Evaluate>
Result run_with_grads(Evaluate evaluate, int64_t degree, const Inputs& in,
                      const torch::Tensor& cotangent) {
  const torch::Tensor dirs = in.dirs.detach().clone().requires_grad_(true);
  const torch::Tensor coeffs = in.coeffs.detach().clone().requires_grad_(true);
  Result r;
  r.colors = evaluate(degree, dirs, coeffs);
  const torch::Tensor loss = (r.colors * cotangent).sum();
  if (loss.requires_grad()) loss.backward();
  r.v_dirs = dirs.grad().defined() ? dirs.grad() : torch::zeros_like(dirs);
  r.v_coeffs = coeffs.grad().defined() ? coeffs.grad() : torch::zeros_like(coeffs);
  return r;
}

torch::Tensor op_sh(int64_t degree, const torch::Tensor& dirs, const torch::Tensor& coeffs) {
  return spherical_harmonics(degree, dirs, coeffs);
}

torch::Tensor ref_sh(int64_t degree, const torch::Tensor& dirs, const torch::Tensor& coeffs) {
  return test::reference_spherical_harmonics(degree, dirs, coeffs);
}

void compare_to_reference(int64_t degree, int64_t num_bases, int64_t n, torch::ScalarType dtype,
                          uint64_t seed) {
  const std::string what = std::string(c10::toString(dtype)) + " degree " +
                           std::to_string(degree) + " K=" + std::to_string(num_bases) +
                           " N=" + std::to_string(n);
  const double rtol = dtype == torch::kFloat32 ? kRtol32 : kRtol64;
  const double atol = dtype == torch::kFloat32 ? kAtol32 : kAtol64;
  const Inputs in = make_inputs(n, num_bases, dtype, seed);
  torch::manual_seed(seed + 1);
  const torch::Tensor cotangent = torch::randn({n, 3}, torch::dtype(dtype));
  const Result ref = run_with_grads(ref_sh, degree, in, cotangent);
  const Result out = run_with_grads(op_sh, degree, in, cotangent);
  expect_close(out.colors, ref.colors, rtol, atol, what + " colors");
  expect_close(out.v_dirs, ref.v_dirs, rtol, atol, what + " v_dirs");
  expect_close(out.v_coeffs, ref.v_coeffs, rtol, atol, what + " v_coeffs");
  // Coefficients above the active degree get exactly zero gradient.
  const int64_t active = (degree + 1) * (degree + 1);
  EXPECT_EQ(out.v_coeffs.slice(1, active).abs().sum().item<double>(), 0.0) << what;
}

const std::vector<int64_t> kSizes = {0, 1, 5, 1000};

TEST(SphericalHarmonics, MatchesReferenceFloat64) {
  uint64_t seed = 100;
  for (int64_t degree = 0; degree <= 3; ++degree)
    for (int64_t num_bases : {(degree + 1) * (degree + 1), int64_t{16}})
      for (int64_t n : kSizes) compare_to_reference(degree, num_bases, n, torch::kFloat64, seed++);
}

TEST(SphericalHarmonics, MatchesReferenceFloat32) {
  uint64_t seed = 200;
  for (int64_t degree = 0; degree <= 3; ++degree)
    for (int64_t num_bases : {(degree + 1) * (degree + 1), int64_t{16}})
      for (int64_t n : kSizes) compare_to_reference(degree, num_bases, n, torch::kFloat32, seed++);
}

// The scenes clamp a share of the channels, and those pass no gradient to coeffs.
TEST(SphericalHarmonics, ClampedChannelsPassNoGradient) {
  const Inputs in = make_inputs(2000, 16, torch::kFloat64, 301);
  const torch::Tensor cotangent = torch::ones({2000, 3}, torch::kFloat64);
  const Result out = run_with_grads(op_sh, 3, in, cotangent);
  const torch::Tensor clamped = out.colors == 0;
  EXPECT_GT(clamped.sum().item<int64_t>(), 300);
  EXPECT_LT(clamped.sum().item<int64_t>(), 3000);
  // v_coeffs[:, 0, c] = C0 * v_color where not clamped, 0 where clamped.
  const torch::Tensor expected = torch::where(clamped, torch::zeros_like(out.colors),
                                              torch::full_like(out.colors, 0.28209479177387814));
  expect_close(out.v_coeffs.select(1, 0), expected, 1e-15, 0, "DC gradient");
}

// Degree 0: colour = C0 * dc + 0.5 (clamped), independent of the direction.
TEST(SphericalHarmonics, DegreeZeroIsTheDcTerm) {
  const Inputs in = make_inputs(100, 4, torch::kFloat64, 401);
  const Result out = run_with_grads(op_sh, 0, in, torch::randn({100, 3}, torch::kFloat64));
  const torch::Tensor expected =
      torch::clamp_min(0.28209479177387814 * in.coeffs.select(1, 0) + 0.5, 0.0);
  expect_close(out.colors, expected, 1e-15, 0, "colors");
  EXPECT_EQ(out.v_dirs.abs().sum().item<double>(), 0.0);
}

// Hand-checked degree 1 along +z: Y = (C0, 0, C1, 0).
TEST(SphericalHarmonics, HandComputedDegreeOne) {
  const torch::Tensor dirs = torch::tensor({{0.0, 0.0, 2.0}}, torch::kFloat64);
  torch::Tensor coeffs = torch::zeros({1, 4, 3}, torch::kFloat64);
  coeffs[0][0] = torch::tensor({0.1, 0.2, 0.3}, torch::kFloat64);
  coeffs[0][1] = torch::tensor({5.0, 5.0, 5.0}, torch::kFloat64);  // multiplies -C1 y = 0
  coeffs[0][2] = torch::tensor({0.4, -0.5, 0.6}, torch::kFloat64);
  const torch::Tensor colors = spherical_harmonics(1, dirs, coeffs);
  for (int c = 0; c < 3; ++c) {
    const double expected = 0.28209479177387814 * coeffs[0][0][c].item<double>() +
                            0.4886025119029199 * coeffs[0][2][c].item<double>() + 0.5;
    EXPECT_NEAR(colors[0][c].item<double>(), expected, 1e-15) << c;
  }
}

// Colours depend on the direction only, not its length; v_dirs is orthogonal to dirs.
TEST(SphericalHarmonics, DirectionScaleInvariance) {
  const Inputs in = make_inputs(300, 16, torch::kFloat64, 501);
  const torch::Tensor cotangent = torch::randn({300, 3}, torch::kFloat64);
  const Result a = run_with_grads(op_sh, 3, in, cotangent);
  const Result b = run_with_grads(op_sh, 3, Inputs{in.dirs * 4.0, in.coeffs}, cotangent);
  expect_close(b.colors, a.colors, kRtol64, kAtol64, "colors");
  expect_close(b.v_dirs * 4.0, a.v_dirs, kRtol64, kAtol64, "v_dirs");
  const torch::Tensor radial = (a.v_dirs * in.dirs).sum(1);
  EXPECT_LT(radial.abs().max().item<double>(), 1e-12 * (1 + a.v_dirs.abs().max().item<double>()));
}

// Central finite differences in float64 against the op's backward, every degree.
TEST(SphericalHarmonics, FiniteDifferencesFloat64) {
  for (int64_t degree = 0; degree <= 3; ++degree) {
    const Inputs in = make_inputs(4, 16, torch::kFloat64, 601 + degree);
    // Keep every channel clear of the clamp (its kink would spoil the differences): a large DC
    // term, small higher-order ones.
    in.coeffs.select(1, 0).fill_(2.0);
    in.coeffs.slice(1, 1).mul_(0.25);
    const torch::Tensor cotangent = torch::randn({4, 3}, torch::kFloat64);
    const Result out = run_with_grads(op_sh, degree, in, cotangent);
    ASSERT_TRUE((out.colors > 0.05).all().item<bool>());
    const auto loss = [&](const torch::Tensor& dirs, const torch::Tensor& coeffs) {
      torch::NoGradGuard no_grad;
      return (spherical_harmonics(degree, dirs, coeffs) * cotangent).sum().item<double>();
    };
    constexpr double kStep = 1e-6;
    for (const bool wrt_dirs : {true, false}) {
      const torch::Tensor base = wrt_dirs ? in.dirs : in.coeffs;
      const torch::Tensor analytic = (wrt_dirs ? out.v_dirs : out.v_coeffs).reshape(-1);
      for (int64_t k = 0; k < base.numel(); ++k) {
        torch::Tensor plus = base.clone(), minus = base.clone();
        plus.view(-1)[k] += kStep;
        minus.view(-1)[k] -= kStep;
        const double numeric = wrt_dirs ? (loss(plus, in.coeffs) - loss(minus, in.coeffs))
                                        : (loss(in.dirs, plus) - loss(in.dirs, minus));
        EXPECT_NEAR(analytic[k].item<double>(), numeric / (2 * kStep), 1e-7)
            << (wrt_dirs ? "dirs[" : "coeffs[") << k << "] degree " << degree;
      }
    }
  }
}

// The test must be able to fail: a reference of another degree is told apart.
TEST(SphericalHarmonics, ReferenceComparisonDetectsADifferentDegree) {
  const Inputs in = make_inputs(200, 16, torch::kFloat64, 701);
  const torch::Tensor out = spherical_harmonics(3, in.dirs, in.coeffs);
  const torch::Tensor ref = test::reference_spherical_harmonics(2, in.dirs, in.coeffs);
  EXPECT_GT((out - ref).abs().max().item<double>(), 1e-3);
}

TEST(SphericalHarmonics, NonContiguousInputsMatchContiguous) {
  const Inputs in = make_inputs(100, 9, torch::kFloat32, 801);
  const torch::Tensor dirs = torch::stack({in.dirs, torch::zeros_like(in.dirs)}, 2).select(2, 0);
  const torch::Tensor coeffs = in.coeffs.transpose(1, 2).contiguous().transpose(1, 2);
  ASSERT_FALSE(dirs.is_contiguous());
  ASSERT_FALSE(coeffs.is_contiguous());
  EXPECT_TRUE(torch::equal(spherical_harmonics(2, dirs, coeffs),
                           spherical_harmonics(2, in.dirs, in.coeffs)));
}

// The trainer passes a 3DGS model's two coefficient tensors (sh_dc, sh_rest) as they are: the
// colours and every gradient equal those of the one-tensor form bitwise, and the gradients come
// back in the two tensors' own shapes (no [N, K, 3] gradient to split).
TEST(SphericalHarmonics, SplitCoefficientsMatchOneTensor) {
  for (const int64_t num_bases : {1, 4, 16}) {
    const Inputs in = make_inputs(300, num_bases, torch::kFloat32, 811 + num_bases);
    const torch::Tensor cotangent = torch::randn({300, 3});
    for (int64_t degree = 0; (degree + 1) * (degree + 1) <= num_bases; ++degree) {
      const std::string what = "K=" + std::to_string(num_bases) + " degree " + std::to_string(degree);
      const Result one = run_with_grads(op_sh, degree, in, cotangent);
      const torch::Tensor dirs = in.dirs.detach().clone().requires_grad_(true);
      const torch::Tensor dc = in.coeffs.slice(1, 0, 1).clone().requires_grad_(true);
      const torch::Tensor rest = in.coeffs.slice(1, 1).clone().requires_grad_(true);
      const torch::Tensor colors = spherical_harmonics(degree, dirs, dc, rest);
      (colors * cotangent).sum().backward();
      EXPECT_TRUE(torch::equal(colors, one.colors)) << what;
      EXPECT_TRUE(torch::equal(dirs.grad(), one.v_dirs)) << what;
      ASSERT_TRUE(dc.grad().defined()) << what;
      EXPECT_EQ(dc.grad().sizes(), dc.sizes()) << what;
      EXPECT_TRUE(torch::equal(dc.grad(), one.v_coeffs.slice(1, 0, 1))) << what;
      if (num_bases > 1) {
        ASSERT_TRUE(rest.grad().defined()) << what;
        EXPECT_EQ(rest.grad().sizes(), rest.sizes()) << what;
        EXPECT_TRUE(torch::equal(rest.grad(), one.v_coeffs.slice(1, 1))) << what;
      }
    }
  }
  // The two pieces are checked as the one tensor is.
  const torch::Tensor dirs = torch::randn({5, 3}), dc = torch::randn({5, 1, 3}),
                      rest = torch::randn({5, 15, 3});
  EXPECT_NO_THROW(spherical_harmonics(3, dirs, dc, rest));
  EXPECT_THROW(spherical_harmonics(3, dirs, torch::randn({5, 2, 3}), rest), c10::Error);
  EXPECT_THROW(spherical_harmonics(3, dirs, dc, rest.slice(1, 0, 7)), c10::Error);  // K = 8
  EXPECT_THROW(spherical_harmonics(3, dirs, dc.slice(0, 0, 4), rest), c10::Error);
  EXPECT_THROW(spherical_harmonics(3, dirs, dc, rest.to(torch::kFloat64)), c10::Error);
}

TEST(SphericalHarmonics, BackwardIsDeterministicAcrossThreadCounts) {
  const Inputs in = make_inputs(50000, 16, torch::kFloat32, 901);
  const torch::Tensor cotangent = torch::randn({50000, 3});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Result a = run_with_grads(op_sh, 3, in, cotangent);
  at::set_num_threads(std::max(2, threads));
  const Result b = run_with_grads(op_sh, 3, in, cotangent);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(a.v_dirs, b.v_dirs));
  EXPECT_TRUE(torch::equal(a.v_coeffs, b.v_coeffs));
}

TEST(SphericalHarmonics, RejectsBadInput) {
  const torch::Tensor dirs = torch::randn({5, 3}), coeffs = torch::randn({5, 16, 3});
  EXPECT_THROW(spherical_harmonics(-1, dirs, coeffs), c10::Error);
  EXPECT_THROW(spherical_harmonics(4, dirs, coeffs), c10::Error);
  EXPECT_THROW(spherical_harmonics(2, dirs, coeffs.slice(1, 0, 4)), c10::Error);  // K too small
  EXPECT_THROW(spherical_harmonics(0, dirs, coeffs.slice(1, 0, 5)), c10::Error);  // K not square
  EXPECT_THROW(spherical_harmonics(1, dirs.view({3, 5}), coeffs), c10::Error);
  EXPECT_THROW(spherical_harmonics(1, dirs, coeffs.slice(0, 0, 4)), c10::Error);
  EXPECT_THROW(spherical_harmonics(1, dirs, coeffs.slice(2, 0, 2)), c10::Error);
  EXPECT_THROW(spherical_harmonics(1, dirs, coeffs.view({5, 48})), c10::Error);
  EXPECT_THROW(spherical_harmonics(1, dirs, coeffs.to(torch::kFloat64)), c10::Error);
  EXPECT_THROW(spherical_harmonics(1, dirs.to(torch::kInt64), coeffs.to(torch::kInt64)),
               c10::Error);
  EXPECT_THROW(spherical_harmonics(1, dirs.to(torch::kFloat16), coeffs.to(torch::kFloat16)),
               c10::Error);
  EXPECT_NO_THROW(spherical_harmonics(3, dirs, coeffs));
  EXPECT_NO_THROW(spherical_harmonics(1, dirs, coeffs.slice(1, 0, 4)));
}

// --- CUDA ------------------------------------------------------------------------------------

TEST(SphericalHarmonicsCuda, MatchesCpuForwardAndBackward) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  uint64_t seed = 1000;
  std::vector<int64_t> sizes = kSizes;
  sizes.push_back(100000);
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const double rtol = dtype == torch::kFloat32 ? kRtol32 : kRtol64;
    const double atol = dtype == torch::kFloat32 ? kAtol32 : kAtol64;
    for (int64_t degree = 0; degree <= 3; ++degree) {
      for (int64_t n : sizes) {
        const std::string what = "cuda " + std::string(c10::toString(dtype)) + " degree " +
                                 std::to_string(degree) + " N=" + std::to_string(n);
        const Inputs in = make_inputs(n, 16, dtype, seed++);
        const torch::Tensor cotangent = torch::randn({n, 3}, torch::dtype(dtype));
        const Result cpu_out = run_with_grads(op_sh, degree, in, cotangent);
        const Result out = run_with_grads(op_sh, degree,
                                          Inputs{in.dirs.to(device), in.coeffs.to(device)},
                                          cotangent.to(device));
        ASSERT_TRUE(out.colors.is_cuda()) << what;
        expect_close(out.colors.cpu(), cpu_out.colors, rtol, atol, what + " colors");
        expect_close(out.v_dirs.cpu(), cpu_out.v_dirs, rtol, atol, what + " v_dirs");
        expect_close(out.v_coeffs.cpu(), cpu_out.v_coeffs, rtol, atol, what + " v_coeffs");
      }
    }
  }
}

}  // namespace
}  // namespace tessera::kernels
