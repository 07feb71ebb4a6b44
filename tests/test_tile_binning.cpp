// Tests of kernels::bin_gaussians against a naive per-tile loop (exact): shapes, tile sizes, the
// tile mask, culled and empty inputs, depth ties, thread-count independence, bad input, CUDA.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "kernels/nonfinite.h"
#include "kernels/tile_binning.h"
#include "tests/cuda_skip.h"

namespace tessera::kernels {
namespace {

struct Projected {
  torch::Tensor means2d;  // [N, 2]
  torch::Tensor radii;    // [N] int32
  torch::Tensor depths;   // [N]
};

// N Gaussians over a width x height image: centres up to 40 px outside it, radii from 0 (culled,
// ~10%) to 60 px (a few huge), depths quantized to 0.05 so that ties occur.
Projected make_projected(int64_t n, int64_t width, int64_t height, torch::ScalarType dtype,
                         uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> means(2 * n), depths(n);
  std::vector<int32_t> radii(n);
  for (int64_t g = 0; g < n; ++g) {
    means[2 * g] = -40.0 + (width + 80.0) * unit(rng);
    means[2 * g + 1] = -40.0 + (height + 80.0) * unit(rng);
    const double kind = unit(rng);
    radii[g] = kind < 0.1 ? 0 : kind < 0.95 ? 1 + static_cast<int32_t>(12 * unit(rng))
                                            : 20 + static_cast<int32_t>(40 * unit(rng));
    depths[g] = 0.05 * std::floor(20.0 * (0.2 + 5.0 * unit(rng)));
  }
  Projected p;
  p.means2d = torch::tensor(means, torch::kFloat64).view({n, 2}).to(dtype);
  p.radii = torch::tensor(radii, torch::kInt32);
  p.depths = torch::tensor(depths, torch::kFloat64).to(dtype);
  return p;
}

// The naive binning: for every tile in the mask, every Gaussian whose rect covers it, sorted by
// (depth, id). The rect is the header's rule written out again.
TileBins naive_bins(const Projected& p, int64_t width, int64_t height, int64_t tile_size,
                    const torch::Tensor& mask) {
  const int64_t n = p.means2d.size(0);
  const int64_t tiles_x = (width + tile_size - 1) / tile_size;
  const int64_t tiles_y = (height + tile_size - 1) / tile_size;
  const torch::Tensor m = p.means2d.to(torch::kFloat64).contiguous();
  const torch::Tensor d = p.depths.to(torch::kFloat64).contiguous();
  const auto clamp_floor = [](double v, int64_t hi) {
    return static_cast<int64_t>(std::min<double>(std::max(0.0, std::floor(v)), hi));
  };
  std::vector<int64_t> offsets{0}, ids;
  for (int64_t t = 0; t < tiles_x * tiles_y; ++t) {
    const int64_t tx = t % tiles_x, ty = t / tiles_x;
    std::vector<int64_t> in_tile;
    if (!mask.defined() || mask[t].item<bool>()) {
      for (int64_t g = 0; g < n; ++g) {
        const double x = m[g][0].item<double>(), y = m[g][1].item<double>();
        const double r = p.radii[g].item<int32_t>();
        if (r <= 0 || !std::isfinite(x) || !std::isfinite(y) ||
            !std::isfinite(d[g].item<double>()))
          continue;
        const double ts = static_cast<double>(tile_size);
        if (clamp_floor((x - r) / ts, tiles_x) <= tx && tx < clamp_floor((x + r + ts - 1) / ts,
                                                                          tiles_x) &&
            clamp_floor((y - r) / ts, tiles_y) <= ty && ty < clamp_floor((y + r + ts - 1) / ts,
                                                                          tiles_y))
          in_tile.push_back(g);
      }
    }
    std::stable_sort(in_tile.begin(), in_tile.end(), [&](int64_t a, int64_t b) {
      return d[a].item<double>() < d[b].item<double>();
    });
    ids.insert(ids.end(), in_tile.begin(), in_tile.end());
    offsets.push_back(static_cast<int64_t>(ids.size()));
  }
  return {torch::tensor(offsets, torch::kInt64), torch::tensor(ids, torch::kInt64)};
}

void expect_same_bins(const TileBins& actual, const TileBins& expected, const std::string& what) {
  ASSERT_EQ(actual.tile_offsets.scalar_type(), torch::kInt64) << what;
  ASSERT_EQ(actual.gaussian_ids.scalar_type(), torch::kInt64) << what;
  EXPECT_TRUE(torch::equal(actual.tile_offsets.cpu(), expected.tile_offsets))
      << what << ": tile_offsets differ";
  EXPECT_TRUE(torch::equal(actual.gaussian_ids.cpu(), expected.gaussian_ids))
      << what << ": gaussian_ids differ (" << actual.gaussian_ids.numel() << " vs "
      << expected.gaussian_ids.numel() << " entries)";
}

struct Case {
  int64_t n, width, height, tile_size;
};

const std::vector<Case> kCases = {{0, 32, 32, 16},    {1, 16, 16, 16},   {50, 1, 1, 16},
                                  {200, 37, 29, 16},  {300, 100, 7, 16}, {400, 64, 48, 8},
                                  {300, 45, 33, 5},   {500, 130, 70, 16}};

std::string name_of(const Case& c, torch::ScalarType dtype) {
  return std::string(c10::toString(dtype)) + " N=" + std::to_string(c.n) + " " +
         std::to_string(c.width) + "x" + std::to_string(c.height) + " tile " +
         std::to_string(c.tile_size);
}

TEST(TileBinning, MatchesNaiveLoop) {
  uint64_t seed = 1;
  for (const auto dtype : {torch::kFloat32, torch::kFloat64})
    for (const Case& c : kCases) {
      const Projected p = make_projected(c.n, c.width, c.height, dtype, seed++);
      const TileBins bins =
          bin_gaussians(p.means2d, p.radii, p.depths, c.width, c.height, c.tile_size);
      expect_same_bins(bins, naive_bins(p, c.width, c.height, c.tile_size, {}), name_of(c, dtype));
    }
}

TEST(TileBinning, TileMaskDropsMaskedTiles) {
  uint64_t seed = 20;
  for (const Case& c : kCases) {
    const int64_t num_tiles = tiles_along(c.width, c.tile_size) * tiles_along(c.height, c.tile_size);
    const Projected p = make_projected(c.n, c.width, c.height, torch::kFloat32, seed++);
    torch::manual_seed(seed);
    const torch::Tensor mask = torch::rand({num_tiles}) < 0.5;
    const TileBins bins =
        bin_gaussians(p.means2d, p.radii, p.depths, c.width, c.height, c.tile_size, mask);
    expect_same_bins(bins, naive_bins(p, c.width, c.height, c.tile_size, mask),
                     "masked " + name_of(c, torch::kFloat32));
    // Masked-out tiles have empty lists; unmasked ones equal the unmasked binning's lists.
    const TileBins all = bin_gaussians(p.means2d, p.radii, p.depths, c.width, c.height,
                                       c.tile_size);
    for (int64_t t = 0; t < num_tiles; ++t) {
      const int64_t a = bins.tile_offsets[t].item<int64_t>(),
                    b = bins.tile_offsets[t + 1].item<int64_t>();
      if (!mask[t].item<bool>()) {
        EXPECT_EQ(a, b) << "masked tile " << t;
      } else {
        const torch::Tensor full = all.gaussian_ids.slice(
            0, all.tile_offsets[t].item<int64_t>(), all.tile_offsets[t + 1].item<int64_t>());
        EXPECT_TRUE(torch::equal(bins.gaussian_ids.slice(0, a, b), full)) << "tile " << t;
      }
    }
  }
  // All-false mask: nothing at all; all-true: same as no mask.
  const Projected p = make_projected(100, 40, 40, torch::kFloat32, 99);
  const TileBins none = bin_gaussians(p.means2d, p.radii, p.depths, 40, 40, 16,
                                      torch::zeros({9}, torch::kBool));
  EXPECT_EQ(none.gaussian_ids.numel(), 0);
  EXPECT_TRUE(torch::equal(none.tile_offsets, torch::zeros({10}, torch::kInt64)));
  const TileBins every = bin_gaussians(p.means2d, p.radii, p.depths, 40, 40, 16,
                                       torch::ones({9}, torch::kBool));
  expect_same_bins(every, bin_gaussians(p.means2d, p.radii, p.depths, 40, 40, 16), "all-true");
}

TEST(TileBinning, KnownRectsAndOrder) {
  // 48 x 32 image, tiles 16: 3 x 2 tiles. Gaussian 0 at (20, 10) r 3: tiles x [1, 2), y [0, 1)
  // (x1 = floor((20 + 3 + 15) / 16) = 2). Gaussian 1 at (16, 16) r 1: x [0, 2), y [0, 2).
  // Gaussian 2 culled. Gaussian 3 at (47.5, 31.5) r 100: every tile. Depths 2, 1, 0, 2: in tile
  // 1 the order is 1 (depth 1), 0 and 3 (depth 2, by id).
  const torch::Tensor means = torch::tensor({20.0f, 10.0f, 16.0f, 16.0f, 5.0f, 5.0f, 47.5f, 31.5f})
                                  .view({4, 2});
  const torch::Tensor radii = torch::tensor({3, 1, 0, 100}, torch::kInt32);
  const torch::Tensor depths = torch::tensor({2.0f, 1.0f, 0.0f, 2.0f});
  const TileBins bins = bin_gaussians(means, radii, depths, 48, 32);
  EXPECT_TRUE(torch::equal(bins.tile_offsets, torch::tensor({0, 2, 5, 6, 8, 10, 11})))
      << bins.tile_offsets;
  EXPECT_TRUE(torch::equal(bins.gaussian_ids,
                           torch::tensor({1, 3, 1, 0, 3, 3, 1, 3, 1, 3, 3})))
      << bins.gaussian_ids;
}

TEST(TileBinning, CulledAndNonFiniteGaussiansTouchNothing) {
  Projected p = make_projected(60, 50, 50, torch::kFloat64, 30);
  p.radii.zero_();
  TileBins bins = bin_gaussians(p.means2d, p.radii, p.depths, 50, 50);
  EXPECT_EQ(bins.gaussian_ids.numel(), 0);
  EXPECT_EQ(bins.tile_offsets.numel(), 17);
  EXPECT_EQ(bins.tile_offsets.abs().sum().item<int64_t>(), 0);
  // Negative radii are culled too; NaN / Inf centres and depths are skipped.
  p.radii.fill_(5);
  p.radii[0] = -3;
  p.means2d[1][0] = std::numeric_limits<double>::quiet_NaN();
  p.means2d[2][1] = std::numeric_limits<double>::infinity();
  p.depths[3] = std::numeric_limits<double>::quiet_NaN();
  bins = bin_gaussians(p.means2d, p.radii, p.depths, 50, 50);
  for (int64_t g = 0; g < 4; ++g)
    EXPECT_EQ((bins.gaussian_ids == g).sum().item<int64_t>(), 0) << "Gaussian " << g;
  expect_same_bins(bins, naive_bins(p, 50, 50, 16, {}), "non-finite");
}

TEST(TileBinning, EmptyImageAndNoGaussians) {
  const Projected p = make_projected(10, 20, 20, torch::kFloat32, 40);
  const TileBins empty_image = bin_gaussians(p.means2d, p.radii, p.depths, 0, 20);
  EXPECT_TRUE(torch::equal(empty_image.tile_offsets, torch::zeros({1}, torch::kInt64)));
  EXPECT_EQ(empty_image.gaussian_ids.numel(), 0);
  const Projected none = make_projected(0, 20, 20, torch::kFloat32, 41);
  const TileBins bins = bin_gaussians(none.means2d, none.radii, none.depths, 20, 20);
  EXPECT_TRUE(torch::equal(bins.tile_offsets, torch::zeros({5}, torch::kInt64)));
  EXPECT_EQ(bins.gaussian_ids.numel(), 0);
}

TEST(TileBinning, NegativeZeroDepthEqualsPositiveZero) {
  const torch::Tensor means = torch::full({3, 2}, 8.0);
  const torch::Tensor radii = torch::full({3}, 2, torch::kInt32);
  const torch::Tensor depths = torch::tensor({0.0, -0.0, 0.0});
  const TileBins bins = bin_gaussians(means, radii, depths, 16, 16);
  EXPECT_TRUE(torch::equal(bins.gaussian_ids, torch::tensor({0, 1, 2})));
}

TEST(TileBinning, SameOutputForAnyThreadCount) {
  const Projected p = make_projected(5000, 300, 200, torch::kFloat32, 50);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const TileBins one = bin_gaussians(p.means2d, p.radii, p.depths, 300, 200);
  at::set_num_threads(2);
  const TileBins two = bin_gaussians(p.means2d, p.radii, p.depths, 300, 200);
  at::set_num_threads(threads);
  EXPECT_GT(one.gaussian_ids.numel(), 5000);
  EXPECT_TRUE(torch::equal(one.tile_offsets, two.tile_offsets));
  EXPECT_TRUE(torch::equal(one.gaussian_ids, two.gaussian_ids));
}

TEST(TileBinning, NonContiguousInputs) {
  const Projected p = make_projected(200, 70, 50, torch::kFloat32, 60);
  const torch::Tensor wide = torch::zeros({200, 4});
  wide.slice(1, 1, 3).copy_(p.means2d);
  const torch::Tensor depths = torch::stack({p.depths, p.depths}, 1).select(1, 1);
  ASSERT_FALSE(depths.is_contiguous());
  expect_same_bins(bin_gaussians(wide.slice(1, 1, 3), p.radii, depths, 70, 50),
                   naive_bins(p, 70, 50, 16, {}), "strided");
}

TEST(TileBinning, RejectsBadInput) {
  const Projected p = make_projected(10, 32, 32, torch::kFloat32, 70);
  const auto bin = [&](const torch::Tensor& m, const torch::Tensor& r, const torch::Tensor& d,
                       int64_t w = 32, int64_t h = 32, int64_t ts = 16,
                       const torch::Tensor& mask = {}) {
    return bin_gaussians(m, r, d, w, h, ts, mask);
  };
  EXPECT_THROW(bin(p.means2d.view({20}), p.radii, p.depths), c10::Error);
  EXPECT_THROW(bin(p.means2d.slice(0, 0, 9), p.radii, p.depths), c10::Error);
  EXPECT_THROW(bin(p.means2d, p.radii.to(torch::kInt64), p.depths), c10::Error);
  EXPECT_THROW(bin(p.means2d, p.radii, p.depths.to(torch::kFloat64)), c10::Error);
  EXPECT_THROW(bin(p.means2d.to(torch::kInt32), p.radii, p.depths), c10::Error);
  EXPECT_THROW(bin(p.means2d, p.radii.slice(0, 0, 5), p.depths), c10::Error);
  EXPECT_THROW(bin(p.means2d, p.radii, p.depths, -1, 32), c10::Error);
  EXPECT_THROW(bin(p.means2d, p.radii, p.depths, 32, 32, 0), c10::Error);
  EXPECT_THROW(bin(p.means2d, p.radii, p.depths, 32, 32, 16, torch::ones({3}, torch::kBool)),
               c10::Error);
  EXPECT_THROW(bin(p.means2d, p.radii, p.depths, 32, 32, 16, torch::ones({4}, torch::kInt32)),
               c10::Error);
  EXPECT_NO_THROW(bin(p.means2d, p.radii, p.depths, 32, 32, 16, torch::ones({4}, torch::kBool)));
}

// --- CUDA ------------------------------------------------------------------------------------

TEST(TileBinningCuda, MatchesCpuExactly) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device dev(torch::kCUDA, 0);
  uint64_t seed = 100;
  std::vector<Case> cases = kCases;
  cases.push_back({20000, 640, 480, 16});
  for (const auto dtype : {torch::kFloat32, torch::kFloat64})
    for (const Case& c : cases) {
      const Projected p = make_projected(c.n, c.width, c.height, dtype, seed++);
      const int64_t num_tiles =
          tiles_along(c.width, c.tile_size) * tiles_along(c.height, c.tile_size);
      const torch::Tensor mask = torch::rand({num_tiles}) < 0.7;
      for (const bool masked : {false, true}) {
        const torch::Tensor m = masked ? mask : torch::Tensor();
        const TileBins cpu_bins =
            bin_gaussians(p.means2d, p.radii, p.depths, c.width, c.height, c.tile_size, m);
        const TileBins gpu_bins =
            bin_gaussians(p.means2d.to(dev), p.radii.to(dev), p.depths.to(dev), c.width,
                          c.height, c.tile_size, masked ? m.to(dev) : m);
        ASSERT_TRUE(gpu_bins.gaussian_ids.is_cuda());
        expect_same_bins(gpu_bins, cpu_bins,
                         "cuda " + name_of(c, dtype) + (masked ? " masked" : ""));
      }
    }
}

TEST(TileBinningCuda, NegativeZeroAndNonFinite) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device dev(torch::kCUDA, 0);
  Projected p = make_projected(300, 64, 64, torch::kFloat32, 110);
  p.depths.slice(0, 0, 100).fill_(-0.0);
  p.depths.slice(0, 100, 200).fill_(0.0);
  p.means2d[5][0] = std::numeric_limits<float>::quiet_NaN();
  p.depths[250] = std::numeric_limits<float>::infinity();
  expect_same_bins(bin_gaussians(p.means2d.to(dev), p.radii.to(dev), p.depths.to(dev), 64, 64),
                   bin_gaussians(p.means2d, p.radii, p.depths, 64, 64), "cuda -0 / non-finite");
}

}  // namespace
}  // namespace tessera::kernels
