// Tests of kernels::rasterize_gaussians (after bin_gaussians) against the dense plain-LibTorch
// reference: image, alphas, last_ids and the gradients of every input; determinism; bad input.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "kernels/gaussian_raster_math.h"
#include "kernels/gaussian_rasterize.h"
#include "kernels/nonfinite.h"
#include "kernels/tile_binning.h"
#include "tests/expect_close.h"
#include "tests/reference/gaussian_raster_reference.h"
#include "tests/cuda_skip.h"

namespace tessera::kernels {
namespace {

using test::expect_close;

// |actual - expected| <= rtol |expected| + atol max(1, max |expected|). The op and the reference
// add the same terms in other orders (per-pixel sequential vs matmul and cumprod; the op
// recomputes T by division in backward), so float64 agrees to ~1e-13 and float32 to a few ulps
// of the largest term accumulated over up to a few hundred Gaussians.
constexpr double kRtol32 = 1e-4, kAtol32 = 1e-5;
constexpr double kRtol64 = 1e-9, kAtol64 = 1e-11;

enum class Kind { kMixed, kOpaque, kFaint };

struct Scene {
  torch::Tensor means2d, conics, colors, opacities, background, radii, depths;
  int64_t width = 0, height = 0, tile_size = 16;
};

// N random Gaussians over the image (centres up to 10 px outside). Mixed: opacities 0.05-0.99,
// std devs 1-8 px, 3% with an indefinite conic (sigma < 0 on part of the plane). Opaque:
// opacities 0.9-1 and 4-15 px, so pixels stop early. Faint: opacities 0.002-0.05, so most
// alphas fall below 1/255.
Scene make_scene(int64_t n, int64_t width, int64_t height, int64_t channels,
                 torch::ScalarType dtype, uint64_t seed, Kind kind = Kind::kMixed,
                 int64_t tile_size = 16) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> means(2 * n), conics(3 * n), colors(n * channels), opac(n), depths(n);
  std::vector<int32_t> radii(n);
  const double lo = kind == Kind::kOpaque ? 4.0 : 1.0, hi = kind == Kind::kOpaque ? 15.0 : 8.0;
  for (int64_t g = 0; g < n; ++g) {
    means[2 * g] = -10.0 + (width + 20.0) * unit(rng);
    means[2 * g + 1] = -10.0 + (height + 20.0) * unit(rng);
    const double sx = lo + (hi - lo) * unit(rng), sy = lo + (hi - lo) * unit(rng);
    const double th = 3.14159265358979 * unit(rng);
    const double cs = std::cos(th), sn = std::sin(th);
    const double cxx = cs * cs * sx * sx + sn * sn * sy * sy;
    const double cyy = sn * sn * sx * sx + cs * cs * sy * sy;
    const double cxy = cs * sn * (sx * sx - sy * sy);
    const double det = cxx * cyy - cxy * cxy;
    conics[3 * g] = cyy / det;
    conics[3 * g + 1] = -cxy / det;
    conics[3 * g + 2] = cxx / det;
    if (kind == Kind::kMixed && unit(rng) < 0.03) conics[3 * g + 1] = 2.0 * (cyy + cxx) / det;
    radii[g] = static_cast<int32_t>(std::ceil(3.0 * std::max(sx, sy)));
    opac[g] = kind == Kind::kOpaque  ? 0.9 + 0.1 * unit(rng)
              : kind == Kind::kFaint ? 0.002 + 0.048 * unit(rng)
                                     : 0.05 + 0.94 * unit(rng);
    depths[g] = 1.0 + 0.01 * std::floor(900.0 * unit(rng));  // ties happen
    for (int64_t ch = 0; ch < channels; ++ch) colors[g * channels + ch] = unit(rng);
  }
  std::vector<double> bg(channels);
  for (auto& v : bg) v = unit(rng);
  const auto f64 = torch::dtype(torch::kFloat64);
  Scene s;
  s.means2d = torch::tensor(means, f64).view({n, 2}).to(dtype);
  s.conics = torch::tensor(conics, f64).view({n, 3}).to(dtype);
  s.colors = torch::tensor(colors, f64).view({n, channels}).to(dtype);
  s.opacities = torch::tensor(opac, f64).to(dtype);
  s.background = torch::tensor(bg, f64).to(dtype);
  s.radii = torch::tensor(radii, torch::kInt32);
  s.depths = torch::tensor(depths, f64).to(dtype);
  s.width = width;
  s.height = height;
  s.tile_size = tile_size;
  return s;
}

struct Result {
  torch::Tensor colors, alphas, last_ids;
  torch::Tensor v_means2d, v_conics, v_colors, v_opacities, v_background;
};

struct Cotangents {
  torch::Tensor colors, alphas;  // [H, W, C], [H, W]; either may be undefined
};

Cotangents random_cotangents(const Scene& s, uint64_t seed, bool colors = true,
                             bool alphas = true) {
  torch::manual_seed(seed);
  const auto opts = s.means2d.options();
  Cotangents c;
  if (colors) c.colors = torch::randn({s.height, s.width, s.colors.size(1)}, opts);
  if (alphas) c.alphas = torch::randn({s.height, s.width}, opts);
  return c;
}

// Forward, and gradients of <colors, c.colors> + <alphas, c.alphas> with respect to every float
// input, through the op (use_reference false) or the reference.
Result run(const Scene& s, const Cotangents& c, bool use_reference, bool with_background = true,
           const torch::Tensor& tile_mask = {}) {
  const torch::Tensor means = s.means2d.detach().clone().requires_grad_(true);
  const torch::Tensor conics = s.conics.detach().clone().requires_grad_(true);
  const torch::Tensor colors = s.colors.detach().clone().requires_grad_(true);
  const torch::Tensor opac = s.opacities.detach().clone().requires_grad_(true);
  const torch::Tensor bg =
      with_background ? s.background.detach().clone().requires_grad_(true) : torch::Tensor();
  Result r;
  if (use_reference) {
    const test::ReferenceRaster out =
        test::reference_rasterize(means, conics, colors, opac, bg, s.radii.to(means.device()),
                                  s.depths, s.width, s.height, s.tile_size, tile_mask);
    r.colors = out.colors;
    r.alphas = out.alphas;
    r.last_ids = out.last_ids;
  } else {
    const TileBins bins = bin_gaussians(means, s.radii, s.depths, s.width, s.height, s.tile_size,
                                        tile_mask);
    const RasterizeOutput out = rasterize_gaussians(means, conics, colors, opac, bg,
                                                    bins.tile_offsets, bins.gaussian_ids,
                                                    s.width, s.height, s.tile_size);
    r.colors = out.colors;
    r.alphas = out.alphas;
    r.last_ids = out.last_ids;
  }
  torch::Tensor loss = torch::zeros({}, means.options());
  if (c.colors.defined()) loss = loss + (r.colors * c.colors).sum();
  if (c.alphas.defined()) loss = loss + (r.alphas * c.alphas).sum();
  std::vector<torch::Tensor> inputs{means, conics, colors, opac};
  if (with_background) inputs.push_back(bg);
  std::vector<torch::Tensor> grads(inputs.size());
  if (loss.requires_grad())
    grads = torch::autograd::grad({loss}, inputs, {}, false, false, /*allow_unused=*/true);
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!grads[k].defined()) grads[k] = torch::zeros_like(inputs[k]);
  r.v_means2d = grads[0];
  r.v_conics = grads[1];
  r.v_colors = grads[2];
  r.v_opacities = grads[3];
  if (with_background) r.v_background = grads[4];
  return r;
}

void compare(const Result& out, const Result& ref, double rtol, double atol,
             const std::string& name, bool exact_last_ids = true) {
  expect_close(out.colors, ref.colors, rtol, atol, name + " colors");
  expect_close(out.alphas, ref.alphas, rtol, atol, name + " alphas");
  if (exact_last_ids) {
    EXPECT_TRUE(torch::equal(out.last_ids.cpu(), ref.last_ids.cpu())) << name << " last_ids";
  }
  expect_close(out.v_means2d, ref.v_means2d, rtol, atol, name + " v_means2d");
  expect_close(out.v_conics, ref.v_conics, rtol, atol, name + " v_conics");
  expect_close(out.v_colors, ref.v_colors, rtol, atol, name + " v_colors");
  expect_close(out.v_opacities, ref.v_opacities, rtol, atol, name + " v_opacities");
  if (ref.v_background.defined())
    expect_close(out.v_background, ref.v_background, rtol, atol, name + " v_background");
}

struct Shape {
  int64_t n, width, height, channels, tile_size;
  Kind kind;
};

std::string name_of(const Shape& c, torch::ScalarType dtype) {
  const char* kinds[] = {"mixed", "opaque", "faint"};
  return std::string(c10::toString(dtype)) + " " + kinds[static_cast<int>(c.kind)] +
         " N=" + std::to_string(c.n) + " " + std::to_string(c.width) + "x" +
         std::to_string(c.height) + " C=" + std::to_string(c.channels) + " tile " +
         std::to_string(c.tile_size);
}

// Image sizes mostly not multiples of the tile; C = 1, 3 and others; all three kinds.
const std::vector<Shape> kShapes = {
    {0, 20, 12, 3, 16, Kind::kMixed},    {1, 16, 16, 3, 16, Kind::kMixed},
    {60, 37, 29, 3, 16, Kind::kMixed},   {80, 50, 18, 1, 16, Kind::kMixed},
    {120, 33, 47, 3, 8, Kind::kMixed},   {150, 40, 30, 3, 16, Kind::kOpaque},
    {100, 23, 41, 1, 16, Kind::kOpaque}, {150, 45, 31, 3, 16, Kind::kFaint},
    {70, 30, 21, 5, 7, Kind::kMixed},    {40, 1, 1, 2, 16, Kind::kMixed}};

TEST(GaussianRasterize, MatchesReferenceFloat64) {
  uint64_t seed = 1;
  for (const Shape& c : kShapes) {
    const Scene s = make_scene(c.n, c.width, c.height, c.channels, torch::kFloat64, seed++,
                               c.kind, c.tile_size);
    const Cotangents cot = random_cotangents(s, seed++);
    compare(run(s, cot, false), run(s, cot, true), kRtol64, kAtol64, name_of(c, torch::kFloat64));
  }
}

TEST(GaussianRasterize, MatchesReferenceFloat32) {
  uint64_t seed = 100;
  for (const Shape& c : kShapes) {
    const Scene s = make_scene(c.n, c.width, c.height, c.channels, torch::kFloat32, seed++,
                               c.kind, c.tile_size);
    const Cotangents cot = random_cotangents(s, seed++);
    compare(run(s, cot, false), run(s, cot, true), kRtol32, kAtol32, name_of(c, torch::kFloat32));
  }
}

// Crowded tiles (hundreds of Gaussians per tile list, most pixels stopping early), where the CPU
// op's row segments, per-tile culling and skipped Gaussians matter most.
TEST(GaussianRasterize, MatchesReferenceCrowded) {
  uint64_t seed = 300;
  for (const auto dtype : {torch::kFloat64, torch::kFloat32})
    for (const int64_t tile : {8, 16})
      for (const Kind kind : {Kind::kMixed, Kind::kFaint}) {
        const Shape c{700, 45, 37, 3, tile, kind};
        const Scene s = make_scene(c.n, c.width, c.height, c.channels, dtype, seed++, kind, tile);
        const Cotangents cot = random_cotangents(s, seed++);
        const bool f64 = dtype == torch::kFloat64;
        compare(run(s, cot, false), run(s, cot, true), f64 ? kRtol64 : kRtol32,
                f64 ? kAtol64 : kAtol32, "crowded " + name_of(c, dtype));
      }
}

// Each output alone (the other grad output reaches backward undefined), and no background.
TEST(GaussianRasterize, PartialCotangentsAndNoBackground) {
  const Scene s = make_scene(90, 35, 26, 3, torch::kFloat64, 200);
  for (const bool colors : {true, false}) {
    const Cotangents cot = random_cotangents(s, 201, colors, !colors);
    for (const bool bg : {true, false})
      compare(run(s, cot, false, bg), run(s, cot, true, bg), kRtol64, kAtol64,
              std::string(colors ? "colors only" : "alphas only") + (bg ? "" : " no background"));
  }
}

TEST(GaussianRasterize, TileMaskRendersOnlyTheBlock) {
  const Scene s = make_scene(120, 48, 40, 3, torch::kFloat64, 210);
  const torch::Tensor mask = torch::tensor({true, false, true, false, true, true, false, true, false});
  const Cotangents cot = random_cotangents(s, 211);
  const Result out = run(s, cot, false, true, mask);
  compare(out, run(s, cot, true, true, mask), kRtol64, kAtol64, "tile mask");
  // A masked-out tile (tile 1: rows 0-15, cols 16-31) shows the background only.
  const torch::Tensor block = out.colors.slice(0, 0, 16).slice(1, 16, 32);
  EXPECT_TRUE(torch::equal(block, s.background.expand_as(block)));
}

// Early stop and the 1/255 skip really happen in the data (so the comparisons above exercise
// them), and the comparison fails when the reference draws Gaussians outside their tile rects.
TEST(GaussianRasterize, RulesAreExercisedAndComparisonCanFail) {
  const Scene opaque = make_scene(150, 40, 30, 3, torch::kFloat64, 220, Kind::kOpaque);
  const Result o = run(opaque, random_cotangents(opaque, 221), false);
  // Many opaque layers: without the stop T would fall far below 1e-4; with it, it never does.
  EXPECT_TRUE((o.alphas <= 1.0 - 1e-4 + 1e-12).all().item<bool>());
  EXPECT_GT((o.alphas > 0.999).sum().item<int64_t>(), 100);

  const Scene faint = make_scene(150, 45, 31, 3, torch::kFloat64, 230, Kind::kFaint);
  const Result f = run(faint, random_cotangents(faint, 231), false);
  // Gaussians whose peak alpha is under 1/255 get no gradient at all.
  const torch::Tensor below = faint.opacities < 1.0 / 255.0;
  ASSERT_GT(below.sum().item<int64_t>(), 0);
  EXPECT_EQ(f.v_opacities.index({below}).abs().max().item<double>(), 0.0);

  Scene wide = make_scene(60, 37, 29, 3, torch::kFloat64, 240);
  const Cotangents cot = random_cotangents(wide, 241);
  const Result op = run(wide, cot, false);
  wide.radii = wide.radii + 16;  // the reference now lets Gaussians reach further tiles
  const Result ref = run(wide, cot, true);
  EXPECT_GT((op.colors - ref.colors).abs().max().item<double>(), 1e-6);
}

TEST(GaussianRasterize, EmptyTilesGetBackground) {
  // Three Gaussians in the top-left tile only: every other tile is background, alpha 0.
  Scene s = make_scene(3, 50, 40, 3, torch::kFloat64, 250);
  s.means2d = torch::tensor({4.0, 5.0, 8.0, 8.0, 10.0, 3.0}, torch::kFloat64).view({3, 2});
  s.radii = torch::full({3}, 3, torch::kInt32);
  const Cotangents cot = random_cotangents(s, 251);
  const Result out = run(s, cot, false);
  compare(out, run(s, cot, true), kRtol64, kAtol64, "one tile");
  const torch::Tensor rest = out.colors.slice(0, 16);
  EXPECT_TRUE(torch::equal(rest, s.background.expand_as(rest)));
  EXPECT_EQ(out.alphas.slice(0, 16).abs().max().item<double>(), 0.0);
  EXPECT_EQ(out.last_ids.slice(1, 16).abs().max().item<int32_t>(), 0);
  EXPECT_GT(out.alphas[4][4].item<double>(), 0.0);
}

TEST(GaussianRasterize, NoGaussians) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const Scene s = make_scene(0, 19, 35, 3, dtype, 260);
    const Cotangents cot = random_cotangents(s, 261);
    const Result out = run(s, cot, false);
    EXPECT_TRUE(torch::equal(out.colors, s.background.expand({35, 19, 3})));
    EXPECT_EQ(out.alphas.abs().max().item<double>(), 0.0);
    EXPECT_EQ(out.v_means2d.sizes(), (std::vector<int64_t>{0, 2}));
    expect_close(out.v_background, cot.colors.sum(std::vector<int64_t>{0, 1}), 1e-6, 1e-6, "v_background");
  }
}

TEST(GaussianRasterize, EmptyImage) {
  const Scene s = make_scene(10, 0, 0, 3, torch::kFloat32, 270);
  const Result out = run(s, Cotangents{}, false);
  EXPECT_EQ(out.colors.sizes(), (std::vector<int64_t>{0, 0, 3}));
  EXPECT_EQ(out.v_means2d.abs().sum().item<double>(), 0.0);
}

// Exact CPU resume needs backward bitwise identical for any thread count.
TEST(GaussianRasterize, CpuBitwiseIdenticalForAnyThreadCount) {
  const Scene s = make_scene(3000, 160, 120, 3, torch::kFloat32, 280);
  const Cotangents cot = random_cotangents(s, 281);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Result one = run(s, cot, false);
  at::set_num_threads(2);
  const Result two = run(s, cot, false);
  at::set_num_threads(4);
  const Result four = run(s, cot, false);
  at::set_num_threads(threads);
  for (const Result* r : {&two, &four}) {
    EXPECT_TRUE(torch::equal(one.colors, r->colors));
    EXPECT_TRUE(torch::equal(one.last_ids, r->last_ids));
    EXPECT_TRUE(torch::equal(one.v_means2d, r->v_means2d));
    EXPECT_TRUE(torch::equal(one.v_conics, r->v_conics));
    EXPECT_TRUE(torch::equal(one.v_colors, r->v_colors));
    EXPECT_TRUE(torch::equal(one.v_opacities, r->v_opacities));
    EXPECT_TRUE(torch::equal(one.v_background, r->v_background));
  }
  EXPECT_GT(one.v_means2d.abs().sum().item<double>(), 0.0);
}

TEST(GaussianRasterize, DensifyGradNormIsInNdcUnits) {
  const torch::Tensor v = torch::tensor({3.0, 4.0, 0.0, 1.0}, torch::kFloat64).view({2, 2});
  const torch::Tensor norm = densify_grad_norm(v, 200, 100);
  EXPECT_NEAR(norm[0].item<double>(), std::hypot(300.0, 200.0), 1e-9);
  EXPECT_NEAR(norm[1].item<double>(), 50.0, 1e-9);
}

TEST(GaussianRasterize, RejectsBadInput) {
  const Scene s = make_scene(20, 32, 32, 3, torch::kFloat32, 290);
  const TileBins b = bin_gaussians(s.means2d, s.radii, s.depths, 32, 32);
  const auto raster = [&](const torch::Tensor& m, const torch::Tensor& con,
                          const torch::Tensor& col, const torch::Tensor& op,
                          const torch::Tensor& bg, const torch::Tensor& off,
                          const torch::Tensor& ids, int64_t w = 32, int64_t h = 32,
                          int64_t ts = 16) {
    return rasterize_gaussians(m, con, col, op, bg, off, ids, w, h, ts);
  };
  const auto& m = s.means2d;
  const auto& con = s.conics;
  const auto& col = s.colors;
  const auto& op = s.opacities;
  const auto& bg = s.background;
  const auto& off = b.tile_offsets;
  const auto& ids = b.gaussian_ids;
  EXPECT_NO_THROW(raster(m, con, col, op, bg, off, ids));
  EXPECT_THROW(raster(m.view({40}), con, col, op, bg, off, ids), c10::Error);
  EXPECT_THROW(raster(m, con.slice(1, 0, 2), col, op, bg, off, ids), c10::Error);
  EXPECT_THROW(raster(m, con, col.slice(1, 0, 0), op, bg, off, ids), c10::Error);
  EXPECT_THROW(raster(m, con, col, op.slice(0, 0, 5), bg, off, ids), c10::Error);
  EXPECT_THROW(raster(m, con, col, op, bg.slice(0, 0, 2), off, ids), c10::Error);
  EXPECT_THROW(raster(m, con.to(torch::kFloat64), col, op, bg, off, ids), c10::Error);
  EXPECT_THROW(raster(m.to(torch::kFloat16), con.to(torch::kFloat16), col.to(torch::kFloat16),
                      op.to(torch::kFloat16), bg.to(torch::kFloat16), off, ids),
               c10::Error);
  EXPECT_THROW(raster(m, con, col, op, bg, off.to(torch::kInt32), ids), c10::Error);
  EXPECT_THROW(raster(m, con, col, op, bg, off, ids.to(torch::kInt32)), c10::Error);
  EXPECT_THROW(raster(m, con, col, op, bg, off, ids, 48, 32), c10::Error);   // T mismatch
  EXPECT_THROW(raster(m, con, col, op, bg, off, ids, 32, 32, 0), c10::Error);
  EXPECT_THROW(raster(m, con, col, op, bg, off, ids, -32, 32), c10::Error);
  // Contents: offsets not ending at M, not monotone, ids out of range.
  EXPECT_THROW(raster(m, con, col, op, bg, off, ids.slice(0, 1)), c10::Error);
  const torch::Tensor shuffled = off.clone();
  shuffled[1] = off[2].item<int64_t>() + 1;
  shuffled[2] = off[2].item<int64_t>();
  EXPECT_THROW(raster(m, con, col, op, bg, shuffled, ids), c10::Error);
  ASSERT_GT(ids.numel(), 0);
  const torch::Tensor bad_ids = ids.clone();
  bad_ids[0] = 20;
  EXPECT_THROW(raster(m, con, col, op, bg, off, bad_ids), c10::Error);
  bad_ids[0] = -1;
  EXPECT_THROW(raster(m, con, col, op, bg, off, bad_ids), c10::Error);
}

// --- CUDA ------------------------------------------------------------------------------------

Scene to_device(const Scene& s, const torch::Device& dev) {
  Scene d = s;
  for (torch::Tensor* t : {&d.means2d, &d.conics, &d.colors, &d.opacities, &d.background,
                           &d.radii, &d.depths})
    *t = t->to(dev);
  return d;
}

// CUDA against the CPU op, forward and backward (the CUDA backward sums per warp, the CPU per
// pixel in order: equal up to reassociation).
// Tile sizes 16 and 8 (whole warps, warp-reduced atomics) and 4 (a half warp per block); channel
// counts with register accumulators (1, 3, 4) and the generic path (2, 5).
TEST(GaussianRasterizeCuda, MatchesCpu) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device dev(torch::kCUDA, 0);
  std::vector<Shape> shapes = kShapes;
  shapes.push_back({40, 30, 22, 4, 4, Kind::kMixed});
  shapes.push_back({20000, 256, 192, 3, 16, Kind::kMixed});
  shapes.push_back({3000, 130, 70, 3, 16, Kind::kOpaque});
  uint64_t seed = 500;
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const double rtol = dtype == torch::kFloat32 ? kRtol32 : kRtol64;
    const double atol = dtype == torch::kFloat32 ? kAtol32 : kAtol64;
    for (const Shape& c : shapes) {
      const Scene s =
          make_scene(c.n, c.width, c.height, c.channels, dtype, seed++, c.kind, c.tile_size);
      const Cotangents cot = random_cotangents(s, seed++);
      const Result cpu = run(s, cot, false);
      const Cotangents dcot{cot.colors.to(dev), cot.alphas.to(dev)};
      const Result gpu = run(to_device(s, dev), dcot, false);
      ASSERT_TRUE(gpu.colors.is_cuda());
      // float32 exp on the GPU may differ by an ulp, which can flip a 1/255 or 1e-4 decision
      // for a rare pixel: last_ids are compared exactly in float64 only.
      compare(gpu, cpu, rtol, atol, "cuda " + name_of(c, dtype), dtype == torch::kFloat64);
    }
  }
}

// float32 backward twice on the same inputs: the same bits (each warp's sum added in fixed point
// with integer atomics, whatever order they land in). Tile sizes 16 (whole warps) and 4 (a half
// warp per block: every thread adds), 20k Gaussians over 256x192, so rows take many adds.
TEST(GaussianRasterizeCuda, BackwardIsBitwiseRepeatable) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device dev(torch::kCUDA, 0);
  uint64_t seed = 700;
  for (const int64_t tile_size : {int64_t{16}, int64_t{4}}) {
    const Scene s = to_device(
        make_scene(20000, 256, 192, 3, torch::kFloat32, seed++, Kind::kMixed, tile_size), dev);
    const Cotangents cot = random_cotangents(s, seed++);
    const Result a = run(s, cot, false), b = run(s, cot, false);
    const std::string name = "tile " + std::to_string(tile_size);
    EXPECT_TRUE(torch::equal(a.v_means2d, b.v_means2d)) << name;
    EXPECT_TRUE(torch::equal(a.v_conics, b.v_conics)) << name;
    EXPECT_TRUE(torch::equal(a.v_colors, b.v_colors)) << name;
    EXPECT_TRUE(torch::equal(a.v_opacities, b.v_opacities)) << name;
    EXPECT_TRUE(torch::equal(a.v_background, b.v_background)) << name;
    EXPECT_TRUE(torch::isfinite(a.v_means2d).all().item<bool>()) << name;
    EXPECT_GT(a.v_opacities.abs().sum().item<double>(), 0.0) << name;
  }
}

TEST(GaussianRasterizeCuda, MatchesReferenceAndNoGaussians) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device dev(torch::kCUDA, 0);
  const Scene s = to_device(make_scene(90, 37, 29, 3, torch::kFloat64, 600), dev);
  const Cotangents cot = random_cotangents(s, 601);
  compare(run(s, cot, false), run(s, cot, true), kRtol64, kAtol64, "cuda vs reference");
  const Scene none = to_device(make_scene(0, 19, 35, 3, torch::kFloat32, 602), dev);
  const Result out = run(none, random_cotangents(none, 603), false);
  EXPECT_TRUE(torch::equal(out.colors.cpu(), none.background.cpu().expand({35, 19, 3})));
}

}  // namespace
}  // namespace tessera::kernels
