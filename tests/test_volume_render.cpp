// Tests of kernels::volume_render against a plain-LibTorch reference (cumprod per ray, autograd
// for gradients): values, gradients, finite differences, invariants, bad input, and CUDA vs CPU.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "tests/expect_close.h"
#include "tests/cuda_skip.h"
#include "kernels/nonfinite.h"
#include "kernels/volume_render.h"

namespace tessera::kernels {
namespace {

// Tolerances: |actual - expected| <= kRtol * |expected| + kAtol * scale, with scale the largest
// |expected| of the tensor (at least 1). The op and the reference add the same terms in another
// order (sequential vs pairwise sums, float vs double cumprod), so float32 differs by a few ulps
// of the largest term; float64 by ~1e-15.
constexpr double kRtol32 = 1e-5, kAtol32 = 1e-6;
constexpr double kRtol64 = 1e-10, kAtol64 = 1e-12;

struct Samples {
  torch::Tensor sigmas;   // [S]
  torch::Tensor rgbs;     // [S, 3]
  torch::Tensor deltas;   // [S]
  torch::Tensor ts;       // [S]
  torch::Tensor offsets;  // [R + 1] int64
};

// Packed samples for rays with the given counts. Densities mix zeros (empty space), moderate
// values and very large ones (opaque surfaces, so early termination triggers); ts increase
// along each ray from the near plane.
Samples make_samples(const std::vector<int64_t>& counts, torch::ScalarType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<int64_t> offsets{0};
  for (int64_t n : counts) offsets.push_back(offsets.back() + n);
  const int64_t num_samples = offsets.back();
  std::vector<double> sigmas(num_samples), rgbs(3 * num_samples), deltas(num_samples),
      ts(num_samples);
  for (size_t ray = 0; ray < counts.size(); ++ray) {
    double t = 2.0;  // near plane
    for (int64_t i = offsets[ray]; i < offsets[ray + 1]; ++i) {
      const double kind = unit(rng);
      sigmas[i] = kind < 0.3 ? 0.0 : kind < 0.85 ? 20.0 * unit(rng) : 100.0 + 1900.0 * unit(rng);
      deltas[i] = 0.001 + 0.05 * unit(rng);
      ts[i] = t + 0.5 * deltas[i];
      t += deltas[i];
      for (int c = 0; c < 3; ++c) rgbs[3 * i + c] = unit(rng);
    }
  }
  const auto f64 = torch::dtype(torch::kFloat64);
  Samples s;
  s.sigmas = torch::tensor(sigmas, f64).to(dtype);
  s.rgbs = torch::tensor(rgbs, f64).view({num_samples, 3}).to(dtype);
  s.deltas = torch::tensor(deltas, f64).to(dtype);
  s.ts = torch::tensor(ts, f64).to(dtype);
  s.offsets = torch::tensor(offsets, torch::dtype(torch::kInt64));
  return s;
}

std::vector<int64_t> random_counts(int64_t num_rays, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> count(lo, hi);
  std::vector<int64_t> counts(num_rays);
  for (auto& n : counts) n = count(rng);
  return counts;
}

// The reference: the same math with tensor ops, one ray at a time. Transmittance before each
// sample is the exclusive cumprod of (1 - alpha) = exp(-sigma * delta); a sample takes part when
// the transmittance before it is still >= threshold (T only decreases, so this is "the ray has
// not stopped yet"). The mask is computed without gradient, as the op treats the stop.
VolumeRenderOutput reference_render(const torch::Tensor& sigmas, const torch::Tensor& rgbs,
                                    const torch::Tensor& deltas, const torch::Tensor& ts,
                                    const torch::Tensor& offsets, double threshold) {
  const auto opts = sigmas.options();
  const int64_t num_rays = offsets.size(0) - 1;
  std::vector<torch::Tensor> rgb, opacity, depth, weights;
  std::vector<int64_t> steps;
  for (int64_t r = 0; r < num_rays; ++r) {
    const int64_t a = offsets[r].item<int64_t>(), b = offsets[r + 1].item<int64_t>();
    if (a == b) {
      rgb.push_back(torch::zeros({3}, opts));
      opacity.push_back(torch::zeros({}, opts));
      depth.push_back(torch::zeros({}, opts));
      steps.push_back(0);
      continue;
    }
    const torch::Tensor survive = torch::exp(-sigmas.slice(0, a, b) * deltas.slice(0, a, b));
    const torch::Tensor alpha = 1 - survive;
    const torch::Tensor before =
        torch::cat({torch::ones({1}, opts), torch::cumprod(survive, 0).slice(0, 0, b - a - 1)});
    const torch::Tensor active = (before.detach() >= threshold).to(opts.dtype());
    const torch::Tensor w = before * alpha * active;
    weights.push_back(w);
    rgb.push_back((w.unsqueeze(1) * rgbs.slice(0, a, b)).sum(0));
    opacity.push_back(w.sum());
    depth.push_back((w * ts.slice(0, a, b)).sum());
    steps.push_back(active.sum().item<int64_t>());
  }
  VolumeRenderOutput out;
  out.rgb = num_rays ? torch::stack(rgb) : torch::zeros({0, 3}, opts);
  out.opacity = num_rays ? torch::stack(opacity) : torch::zeros({0}, opts);
  out.depth = num_rays ? torch::stack(depth) : torch::zeros({0}, opts);
  out.weights = weights.empty() ? torch::zeros({0}, opts) : torch::cat(weights);
  out.num_steps = torch::tensor(steps, torch::dtype(torch::kInt64));
  return out;
}

using test::expect_close;

// Random cotangents for the four float outputs; a missing one stays undefined.
struct Cotangents {
  torch::Tensor rgb, opacity, depth, weights;
};

Cotangents random_cotangents(const VolumeRenderOutput& out, uint64_t seed, bool rgb = true,
                             bool opacity = true, bool depth = true, bool weights = true) {
  torch::manual_seed(seed);
  Cotangents c;
  if (rgb) c.rgb = torch::randn_like(out.rgb);
  if (opacity) c.opacity = torch::randn_like(out.opacity);
  if (depth) c.depth = torch::randn_like(out.depth);
  if (weights) c.weights = torch::randn_like(out.weights);
  return c;
}

torch::Tensor loss_of(const VolumeRenderOutput& out, const Cotangents& c) {
  torch::Tensor loss = torch::zeros({}, out.rgb.options());
  if (c.rgb.defined()) loss = loss + (out.rgb * c.rgb).sum();
  if (c.opacity.defined()) loss = loss + (out.opacity * c.opacity).sum();
  if (c.depth.defined()) loss = loss + (out.depth * c.depth).sum();
  if (c.weights.defined()) loss = loss + (out.weights * c.weights).sum();
  return loss;
}

struct Grads {
  torch::Tensor v_sigmas, v_rgbs;
};

// Forward outputs and the gradients of <outputs, cotangents> through `render`.
template <typename Render>
std::pair<VolumeRenderOutput, Grads> run_with_grads(Render render, const Samples& s,
                                                   double threshold, const Cotangents* c) {
  const torch::Tensor sigmas = s.sigmas.detach().clone().requires_grad_(true);
  const torch::Tensor rgbs = s.rgbs.detach().clone().requires_grad_(true);
  VolumeRenderOutput out = render(sigmas, rgbs, s.deltas, s.ts, s.offsets, threshold);
  Grads g;
  if (c) {
    const torch::Tensor loss = loss_of(out, *c);
    if (loss.requires_grad()) loss.backward();  // the reference with no samples has no graph
    g.v_sigmas = sigmas.grad().defined() ? sigmas.grad() : torch::zeros_like(sigmas);
    g.v_rgbs = rgbs.grad().defined() ? rgbs.grad() : torch::zeros_like(rgbs);
  }
  return {out, g};
}

VolumeRenderOutput op_render(const torch::Tensor& sigmas, const torch::Tensor& rgbs,
                             const torch::Tensor& deltas, const torch::Tensor& ts,
                             const torch::Tensor& offsets, double threshold) {
  return volume_render(sigmas, rgbs, deltas, ts, offsets, threshold);
}

std::string case_name(const std::vector<int64_t>& counts, double threshold,
                      torch::ScalarType dtype) {
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  return std::string(c10::toString(dtype)) + " R=" + std::to_string(counts.size()) +
         " S=" + std::to_string(total) + " threshold=" + std::to_string(threshold);
}

// The shapes every comparison runs on: no rays, empty rays, single samples, and many random
// counts (with and without empty rays among them).
std::vector<std::vector<int64_t>> test_shapes() {
  return {{},
          {0},
          {0, 0, 0},
          {1},
          {1, 0, 2},
          {5, 1, 0, 7, 3},
          random_counts(64, 1, 300, 11),
          random_counts(200, 0, 300, 12),
          random_counts(1000, 0, 32, 13)};
}

const std::vector<double> kThresholds = {0.0, kDefaultTransmittanceThreshold, 1e-2};

// Compares the op against the reference: forward values, num_steps exactly, and the gradients
// of sigmas and rgbs under the given cotangent mask.
void compare_to_reference(const std::vector<int64_t>& counts, torch::ScalarType dtype,
                          double threshold, uint64_t seed, double rtol, double atol,
                          bool rgb = true, bool opacity = true, bool depth = true,
                          bool weights = true) {
  const std::string name = case_name(counts, threshold, dtype);
  const Samples s = make_samples(counts, dtype, seed);
  const VolumeRenderOutput probe = reference_render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets,
                                                    threshold);
  const Cotangents c = random_cotangents(probe, seed + 1, rgb, opacity, depth, weights);
  const auto [ref, ref_grads] = run_with_grads(reference_render, s, threshold, &c);
  const auto [out, grads] = run_with_grads(op_render, s, threshold, &c);
  expect_close(out.rgb, ref.rgb, rtol, atol, name + " rgb");
  expect_close(out.opacity, ref.opacity, rtol, atol, name + " opacity");
  expect_close(out.depth, ref.depth, rtol, atol, name + " depth");
  expect_close(out.weights, ref.weights, rtol, atol, name + " weights");
  EXPECT_TRUE(torch::equal(out.num_steps, ref.num_steps)) << name << " num_steps";
  expect_close(grads.v_sigmas, ref_grads.v_sigmas, rtol, atol, name + " v_sigmas");
  expect_close(grads.v_rgbs, ref_grads.v_rgbs, rtol, atol, name + " v_rgbs");
}

TEST(VolumeRender, MatchesReferenceFloat32) {
  uint64_t seed = 100;
  for (const auto& counts : test_shapes())
    for (double threshold : kThresholds)
      compare_to_reference(counts, torch::kFloat32, threshold, seed++, kRtol32, kAtol32);
}

TEST(VolumeRender, MatchesReferenceFloat64) {
  uint64_t seed = 200;
  for (const auto& counts : test_shapes())
    for (double threshold : kThresholds)
      compare_to_reference(counts, torch::kFloat64, threshold, seed++, kRtol64, kAtol64);
}

// Each output alone: the other grad outputs reach backward undefined and must count as zero.
TEST(VolumeRender, GradientOfEachOutputAlone) {
  const std::vector<int64_t> counts = random_counts(50, 0, 120, 21);
  for (double threshold : {0.0, kDefaultTransmittanceThreshold}) {
    compare_to_reference(counts, torch::kFloat64, threshold, 31, kRtol64, kAtol64, true, false,
                         false, false);
    compare_to_reference(counts, torch::kFloat64, threshold, 32, kRtol64, kAtol64, false, true,
                         false, false);
    compare_to_reference(counts, torch::kFloat64, threshold, 33, kRtol64, kAtol64, false, false,
                         true, false);
    compare_to_reference(counts, torch::kFloat64, threshold, 34, kRtol64, kAtol64, false, false,
                         false, true);
  }
}

// The test must be able to fail: the reference run differs from the op when the threshold does.
TEST(VolumeRender, ReferenceComparisonDetectsADifferentStopRule) {
  const Samples s = make_samples(random_counts(64, 50, 300, 41), torch::kFloat32, 41);
  const auto out = volume_render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets, 0.0);
  const auto ref = reference_render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets, 1e-2);
  EXPECT_FALSE(torch::equal(out.num_steps, ref.num_steps));
  EXPECT_GT((out.weights - ref.weights).abs().max().item<double>(), 1e-6);
}

// Central finite differences in float64 of L = <outputs, cotangents> against the op's backward.
// The stop rule is piecewise constant: the case keeps every transmittance far from the threshold.
TEST(VolumeRender, FiniteDifferencesFloat64) {
  const auto f64 = torch::dtype(torch::kFloat64);
  Samples s;
  s.sigmas = torch::tensor({0.5, 3.0, 0.0, 8.0, 2.0, 1.0, 400.0, 5.0}, f64);
  s.deltas = torch::tensor({0.1, 0.2, 0.3, 0.05, 0.1, 0.2, 0.05, 0.1}, f64);
  s.ts = torch::tensor({1.0, 1.2, 1.5, 1.6, 2.0, 2.1, 2.3, 2.4}, f64);
  torch::manual_seed(51);
  s.rgbs = torch::rand({8, 3}, f64);
  s.offsets = torch::tensor({0, 4, 5, 5, 8}, torch::dtype(torch::kInt64));  // 4, 1, 0, 3 samples
  // Ray 3's transmittance drops from ~0.8 to ~2e-9 at its second sample: with the default
  // threshold its third sample is cut, at threshold 0 it is kept.
  for (double threshold : {0.0, kDefaultTransmittanceThreshold}) {
    const auto probe = volume_render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets, threshold);
    EXPECT_EQ(probe.num_steps[3].item<int64_t>(), threshold > 0 ? 2 : 3);
    const Cotangents c = random_cotangents(probe, 52);
    const auto [out, grads] = run_with_grads(op_render, s, threshold, &c);
    const auto loss = [&](const torch::Tensor& sigmas, const torch::Tensor& rgbs) {
      torch::NoGradGuard no_grad;
      return loss_of(volume_render(sigmas, rgbs, s.deltas, s.ts, s.offsets, threshold), c)
          .item<double>();
    };
    constexpr double kStep = 1e-6;  // central differences: O(h^2) = 1e-12 truncation
    for (const bool wrt_sigmas : {true, false}) {
      const torch::Tensor base = wrt_sigmas ? s.sigmas : s.rgbs;
      const torch::Tensor analytic = (wrt_sigmas ? grads.v_sigmas : grads.v_rgbs).view(-1);
      for (int64_t k = 0; k < base.numel(); ++k) {
        torch::Tensor plus = base.clone(), minus = base.clone();
        plus.view(-1)[k] += kStep;
        minus.view(-1)[k] -= kStep;
        const double numeric =
            wrt_sigmas ? (loss(plus, s.rgbs) - loss(minus, s.rgbs)) / (2 * kStep)
                       : (loss(s.sigmas, plus) - loss(s.sigmas, minus)) / (2 * kStep);
        const double a = analytic[k].item<double>();
        EXPECT_NEAR(a, numeric, 1e-7 + 1e-6 * std::abs(numeric))
            << (wrt_sigmas ? "d/dsigma[" : "d/drgb[") << k << "] threshold=" << threshold;
      }
    }
    // Cut samples (ray 3's third) get no gradient, and the analytic value is not trivially 0.
    if (threshold > 0) {
      EXPECT_EQ(grads.v_sigmas[7].item<double>(), 0.0);
    }
    EXPECT_GT(grads.v_sigmas.abs().sum().item<double>(), 1e-3);
  }
}

TEST(VolumeRender, Invariants) {
  const std::vector<int64_t> counts = random_counts(300, 0, 200, 61);
  for (double threshold : kThresholds) {
    const Samples s = make_samples(counts, torch::kFloat32, 62);
    const auto out = volume_render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets, threshold);
    EXPECT_GE(out.opacity.min().item<float>(), 0.0f);
    EXPECT_LE(out.opacity.max().item<float>(), 1.0f + 1e-6f);
    EXPECT_GE(out.weights.min().item<float>(), 0.0f);
    // Weights sum to opacity per ray.
    const torch::Tensor ray_of_sample = torch::repeat_interleave(
        torch::arange(static_cast<int64_t>(counts.size())), torch::tensor(counts));
    const torch::Tensor sums =
        torch::zeros_like(out.opacity).index_add_(0, ray_of_sample, out.weights);
    expect_close(sums, out.opacity, kRtol32, kAtol32, "sum of weights per ray");
    // Colours lie in [0, opacity] per channel; depth in [near, far] * opacity.
    EXPECT_TRUE((out.rgb <= out.opacity.unsqueeze(1) + 1e-6).all().item<bool>());
    EXPECT_TRUE((out.rgb >= 0).all().item<bool>());
    EXPECT_TRUE((out.depth >= 2.0 * out.opacity - 1e-5).all().item<bool>());
    // Termination: composited samples never exceed the ray's; with threshold 0 it is all of them.
    const torch::Tensor count_tensor = torch::tensor(counts);
    EXPECT_TRUE((out.num_steps <= count_tensor).all().item<bool>());
    if (threshold == 0.0) {
      EXPECT_TRUE(torch::equal(out.num_steps, count_tensor));
    } else {
      EXPECT_LT(out.num_steps.sum().item<int64_t>(), count_tensor.sum().item<int64_t>());
    }
  }
}

// An opaque first sample gives its colour and its t; everything behind it has weight 0.
TEST(VolumeRender, OpaqueFirstSampleGivesItsColour) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto opts = torch::dtype(dtype);
    const torch::Tensor sigmas = torch::tensor({1e4, 5.0, 7.0}, opts);
    const torch::Tensor rgbs =
        torch::tensor({0.2, 0.5, 0.9, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0}, opts).view({3, 3});
    const torch::Tensor deltas = torch::full({3}, 0.1, opts);
    const torch::Tensor ts = torch::tensor({3.0, 3.1, 3.2}, opts);
    const torch::Tensor offsets = torch::tensor({0, 3}, torch::dtype(torch::kInt64));
    for (double threshold : {0.0, kDefaultTransmittanceThreshold}) {
      const auto out = volume_render(sigmas, rgbs, deltas, ts, offsets, threshold);
      expect_close(out.rgb, rgbs.slice(0, 0, 1), 1e-6, 0, "rgb");
      EXPECT_DOUBLE_EQ(out.opacity[0].item<double>(), 1.0);
      EXPECT_NEAR(out.depth[0].item<double>(), 3.0, 1e-6);
      EXPECT_EQ(out.weights[1].item<double>(), 0.0);
      EXPECT_EQ(out.weights[2].item<double>(), 0.0);
      EXPECT_EQ(out.num_steps[0].item<int64_t>(), threshold > 0 ? 1 : 3);
    }
  }
}

TEST(VolumeRender, EmptyInputs) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto opts = torch::dtype(dtype);
    const torch::Tensor sigmas = torch::zeros({0}, opts).requires_grad_(true);
    const torch::Tensor rgbs = torch::zeros({0, 3}, opts).requires_grad_(true);
    const torch::Tensor none = torch::zeros({0}, opts);
    // R = 0, and R = 4 rays with no samples.
    for (const int64_t num_rays : {0, 4}) {
      const torch::Tensor offsets = torch::zeros({num_rays + 1}, torch::kInt64);
      const auto out = volume_render(sigmas, rgbs, none, none, offsets);
      EXPECT_EQ(out.rgb.sizes(), (std::vector<int64_t>{num_rays, 3}));
      EXPECT_EQ(out.opacity.sizes(), (std::vector<int64_t>{num_rays}));
      EXPECT_EQ(out.depth.sizes(), (std::vector<int64_t>{num_rays}));
      EXPECT_EQ(out.weights.sizes(), (std::vector<int64_t>{0}));
      EXPECT_EQ(out.rgb.abs().sum().item<double>() + out.opacity.abs().sum().item<double>(), 0.0);
      (out.rgb.sum() + out.opacity.sum() + out.depth.sum()).backward();
      EXPECT_EQ(sigmas.grad().sizes(), (std::vector<int64_t>{0}));
      EXPECT_EQ(rgbs.grad().sizes(), (std::vector<int64_t>{0, 3}));
    }
  }
}

TEST(VolumeRender, NonContiguousInputsMatchContiguous) {
  const Samples s = make_samples(random_counts(40, 0, 100, 71), torch::kFloat32, 72);
  const int64_t n = s.sigmas.size(0);
  // rgbs as 3 of 5 columns, the others every second element of a longer tensor.
  const torch::Tensor wide = torch::rand({n, 5});
  wide.slice(1, 1, 4).copy_(s.rgbs);
  const auto strided = [&](const torch::Tensor& t) {
    return torch::stack({t, torch::zeros_like(t)}, 1).select(1, 0);
  };
  ASSERT_FALSE(strided(s.sigmas).is_contiguous());
  const auto a = volume_render(strided(s.sigmas), wide.slice(1, 1, 4), strided(s.deltas),
                               strided(s.ts), s.offsets);
  const auto b = volume_render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets);
  EXPECT_TRUE(torch::equal(a.rgb, b.rgb));
  EXPECT_TRUE(torch::equal(a.weights, b.weights));
  EXPECT_TRUE(torch::equal(a.depth, b.depth));
}

TEST(VolumeRender, DispatchMatchesCpuImplementation) {
  const Samples s = make_samples(random_counts(30, 0, 60, 81), torch::kFloat32, 82);
  const auto a = volume_render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets);
  const auto b = cpu::volume_render_fwd(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets,
                                        kDefaultTransmittanceThreshold);
  EXPECT_TRUE(torch::equal(a.rgb, b.rgb));
  EXPECT_TRUE(torch::equal(a.num_steps, b.num_steps));
  EXPECT_TRUE(torch::equal(a.weights, b.weights));
}

TEST(VolumeRender, WorksWithoutGradMode) {
  const Samples s = make_samples({10, 3}, torch::kFloat32, 91);
  torch::NoGradGuard no_grad;
  const auto out = volume_render(s.sigmas.requires_grad_(true), s.rgbs, s.deltas, s.ts, s.offsets);
  EXPECT_FALSE(out.rgb.requires_grad());
}

TEST(VolumeRender, RejectsBadInput) {
  const Samples s = make_samples({3, 2}, torch::kFloat32, 95);
  const auto render = [&](const torch::Tensor& sigmas, const torch::Tensor& rgbs,
                          const torch::Tensor& deltas, const torch::Tensor& ts,
                          const torch::Tensor& offsets, double threshold = 1e-4) {
    return volume_render(sigmas, rgbs, deltas, ts, offsets, threshold);
  };
  EXPECT_THROW(render(s.sigmas.view({5, 1}), s.rgbs, s.deltas, s.ts, s.offsets), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs.slice(1, 0, 2), s.deltas, s.ts, s.offsets), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas.slice(0, 0, 4), s.ts, s.offsets), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts.to(torch::kFloat64), s.offsets), c10::Error);
  EXPECT_THROW(render(s.sigmas.to(torch::kFloat16), s.rgbs.to(torch::kFloat16),
                      s.deltas.to(torch::kFloat16), s.ts.to(torch::kFloat16), s.offsets),
               c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets.to(torch::kInt32)), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts, torch::tensor({0, 4, 3})), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts, torch::tensor({0, 3, 4})), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts, torch::tensor({1, 3, 5})), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts, torch::tensor({0})), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets, -0.1), c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets, 1.5), c10::Error);
  // deltas and ts get no gradient: asking for one is an error, not a silent zero.
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas.clone().requires_grad_(true), s.ts, s.offsets),
               c10::Error);
  EXPECT_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts.clone().requires_grad_(true), s.offsets),
               c10::Error);
  EXPECT_NO_THROW(render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets));
}

// --- CUDA ------------------------------------------------------------------------------------

Samples to_device(const Samples& s, const torch::Device& device) {
  return {s.sigmas.to(device), s.rgbs.to(device), s.deltas.to(device), s.ts.to(device),
          s.offsets.to(device)};
}

TEST(VolumeRenderCuda, MatchesCpuForwardAndBackward) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  uint64_t seed = 300;
  std::vector<std::vector<int64_t>> shapes = test_shapes();
  shapes.push_back(random_counts(20000, 0, 256, 14));  // many blocks
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const double rtol = dtype == torch::kFloat32 ? kRtol32 : kRtol64;
    const double atol = dtype == torch::kFloat32 ? kAtol32 : kAtol64;
    for (const auto& counts : shapes) {
      for (double threshold : kThresholds) {
        const std::string name = "cuda " + case_name(counts, threshold, dtype);
        const Samples s = make_samples(counts, dtype, seed++);
        const auto probe = cpu::volume_render_fwd(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets,
                                                  threshold);
        const Cotangents c = random_cotangents(probe, seed++);
        const auto [cpu_out, cpu_grads] = run_with_grads(op_render, s, threshold, &c);
        const Cotangents cc{c.rgb.to(device), c.opacity.to(device), c.depth.to(device),
                            c.weights.to(device)};
        const auto [out, grads] = run_with_grads(op_render, to_device(s, device), threshold, &cc);
        ASSERT_TRUE(out.rgb.is_cuda()) << name;
        ASSERT_TRUE(grads.v_sigmas.is_cuda()) << name;
        expect_close(out.rgb.cpu(), cpu_out.rgb, rtol, atol, name + " rgb");
        expect_close(out.opacity.cpu(), cpu_out.opacity, rtol, atol, name + " opacity");
        expect_close(out.depth.cpu(), cpu_out.depth, rtol, atol, name + " depth");
        expect_close(out.weights.cpu(), cpu_out.weights, rtol, atol, name + " weights");
        EXPECT_TRUE(torch::equal(out.num_steps.cpu(), cpu_out.num_steps)) << name << " num_steps";
        expect_close(grads.v_sigmas.cpu(), cpu_grads.v_sigmas, rtol, atol, name + " v_sigmas");
        expect_close(grads.v_rgbs.cpu(), cpu_grads.v_rgbs, rtol, atol, name + " v_rgbs");
      }
    }
  }
}

TEST(VolumeRenderCuda, MatchesReferenceWithPartialCotangents) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  const Samples s = to_device(make_samples(random_counts(100, 0, 150, 15), torch::kFloat64, 16),
                              device);
  const auto probe = reference_render(s.sigmas, s.rgbs, s.deltas, s.ts, s.offsets, 1e-4);
  for (int mask = 1; mask < 16; mask <<= 1) {
    const Cotangents c =
        random_cotangents(probe, 17 + mask, mask & 1, mask & 2, mask & 4, mask & 8);
    const auto [ref, ref_grads] = run_with_grads(reference_render, s, 1e-4, &c);
    const auto [out, grads] = run_with_grads(op_render, s, 1e-4, &c);
    const std::string name = "cuda cotangent mask " + std::to_string(mask);
    expect_close(out.weights, ref.weights, kRtol64, kAtol64, name + " weights");
    expect_close(grads.v_sigmas, ref_grads.v_sigmas, kRtol64, kAtol64, name + " v_sigmas");
    expect_close(grads.v_rgbs, ref_grads.v_rgbs, kRtol64, kAtol64, name + " v_rgbs");
  }
}

TEST(VolumeRenderCuda, EmptyInputs) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const auto opts = torch::dtype(torch::kFloat32).device(torch::kCUDA, 0);
  const torch::Tensor sigmas = torch::zeros({0}, opts).requires_grad_(true);
  const torch::Tensor rgbs = torch::zeros({0, 3}, opts).requires_grad_(true);
  const torch::Tensor none = torch::zeros({0}, opts);
  for (int64_t num_rays : {0, 3}) {
    const auto out = volume_render(sigmas, rgbs, none, none,
                                   torch::zeros({num_rays + 1}, opts.dtype(torch::kInt64)));
    EXPECT_EQ(out.rgb.sizes(), (std::vector<int64_t>{num_rays, 3}));
    EXPECT_EQ(out.opacity.cpu().abs().sum().item<float>(), 0.0f);
    (out.rgb.sum() + out.opacity.sum()).backward();
    EXPECT_EQ(sigmas.grad().sizes(), (std::vector<int64_t>{0}));
  }
}

}  // namespace
}  // namespace tessera::kernels
