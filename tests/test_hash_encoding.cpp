// Tests of kernels::hash_encoding against a plain-LibTorch reference (int64 index arithmetic,
// index_select, autograd for v_embeddings): values, gradients, hand-checked cells, determinism,
// linearity, bad input, and CUDA vs CPU.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "tests/expect_close.h"
#include "kernels/hash_encoding.h"
#include "tests/reference/hash_encoding_reference.h"
#include "tests/cuda_skip.h"
#include "kernels/nonfinite.h"

namespace tessera::kernels {
namespace {

// Tolerances: |actual - expected| <= kRtol * |expected| + kAtol * scale, with scale the largest
// |expected| of the tensor (at least 1). The op and the reference compute the same cells and
// weights in float32; they may add the 8 corners (forward) and a row's contributions (backward,
// up to thousands of terms on coarse levels) in another order or with FMA contraction, so values
// differ by a few ulps of the largest term.
constexpr double kRtol = 1e-5, kAtol = 1e-5;

using test::expect_close;

HashEncodingConfig make_config(int levels, int features, int log2_size, int base, double scale) {
  HashEncodingConfig c;
  c.levels = levels;
  c.features_per_level = features;
  c.log2_hashmap_size = log2_size;
  c.base_resolution = base;
  c.per_level_scale = scale;
  return c;
}

std::string config_name(const HashEncodingConfig& c) {
  return "L=" + std::to_string(c.levels) + " F=" + std::to_string(c.features_per_level) +
         " log2T=" + std::to_string(c.log2_hashmap_size) +
         " Nmin=" + std::to_string(c.base_resolution) + " b=" + std::to_string(c.per_level_scale);
}

using test::reference_encoding;

// Forward and v_embeddings of <encoding, cotangent> through `encode`.
template <typename Encode>
std::pair<torch::Tensor, torch::Tensor> run_with_grad(Encode encode, const torch::Tensor& positions,
                                                      const torch::Tensor& embeddings,
                                                      const HashEncodingConfig& c,
                                                      const torch::Tensor& cotangent) {
  const torch::Tensor table = embeddings.detach().clone().requires_grad_(true);
  const torch::Tensor out = encode(positions, table, c);
  (out * cotangent).sum().backward();
  return {out.detach(), table.grad().defined() ? table.grad() : torch::zeros_like(table)};
}

torch::Tensor random_table(const HashEncodingConfig& c, uint64_t seed,
                           const torch::Device& device = torch::kCPU) {
  torch::manual_seed(seed);
  return torch::randn({c.levels, int64_t{1} << c.log2_hashmap_size, c.features_per_level})
      .to(device);
}

// Point sets: empty, one point, many random ones, and the awkward ones: vertices and cell faces of
// every level (multiples of 1 / N_l), exactly 0 and 1, and points outside the unit cube.
std::vector<std::pair<std::string, torch::Tensor>> point_sets(const HashEncodingConfig& c,
                                                              uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<std::pair<std::string, torch::Tensor>> sets;
  sets.emplace_back("N=0", torch::zeros({0, 3}));
  sets.emplace_back("N=1", torch::rand({1, 3}));
  sets.emplace_back("N=10000", torch::rand({10000, 3}));
  std::vector<torch::Tensor> faces;
  for (const auto& level : hash_grid_levels(c)) {
    const int64_t n = level.resolution;
    const torch::Tensor k = torch::randint(0, n + 1, {200, 3}).to(torch::kFloat32) / n;
    const torch::Tensor mix = torch::rand({200, 3}) < 0.5;  // some coordinates on faces only
    faces.push_back(torch::where(mix, k, torch::rand({200, 3})));
  }
  sets.emplace_back("cell faces", torch::cat(faces));
  sets.emplace_back("0 and 1", torch::tensor({0.f, 0.f, 0.f, 1.f, 1.f, 1.f, 0.f, 1.f, 0.f,
                                              1.f, 0.f, 1.f, 0.5f, 1.f, 0.f})
                                   .view({5, 3}));
  sets.emplace_back("outside [0, 1]", torch::rand({500, 3}) * 3 - 1);
  return sets;
}

std::vector<HashEncodingConfig> test_configs() {
  return {
      make_config(3, 2, 12, 2, 1.5),     // dense only: 2, 3, 4 cells, 125 <= 4096 rows
      make_config(8, 2, 10, 4, 2.0),     // dense 4, 8 (729 rows); hashed from 16 cells up
      make_config(1, 4, 8, 37, 1.0),     // one hashed level, collisions everywhere
      make_config(1, 1, 6, 3, 1.0),      // one dense level, 64 vertices fill the 64-row table
      make_config(4, 1, 9, 5, 1.7),      // F = 1, mixed
      make_config(5, 4, 11, 3, 2.3),     // F = 4
      make_config(3, 8, 9, 6, 3.1),      // F = 8
      make_config(2, 3, 7, 2, 4.0),      // F = 3 (the runtime-F path)
      make_config(16, 2, 14, 16, hash_encoding_per_level_scale(16, 1024, 16)),  // instant-ngp-like
  };
}

torch::Tensor op_encoding(const torch::Tensor& p, const torch::Tensor& e,
                          const HashEncodingConfig& c) {
  return hash_encoding(p, e, c);
}

TEST(HashEncoding, MatchesReference) {
  uint64_t seed = 100;
  for (const HashEncodingConfig& c : test_configs()) {
    const torch::Tensor table = random_table(c, seed++);
    for (const auto& [set, positions] : point_sets(c, seed++)) {
      const std::string name = config_name(c) + " " + set;
      torch::manual_seed(seed++);
      const torch::Tensor cotangent =
          torch::randn({positions.size(0), int64_t{c.levels} * c.features_per_level});
      const auto [ref, ref_grad] = run_with_grad(reference_encoding, positions, table, c, cotangent);
      const auto [out, grad] = run_with_grad(op_encoding, positions, table, c, cotangent);
      expect_close(out, ref, kRtol, kAtol, name + " encoding");
      expect_close(grad, ref_grad, kRtol, kAtol, name + " v_embeddings");
      if (positions.size(0) > 0) {
        EXPECT_GT(grad.abs().sum().item<double>(), 0.0) << name;  // not trivially zero
      }
    }
  }
}

// The comparison can fail: the reference on a table shifted by one row differs.
TEST(HashEncoding, ReferenceComparisonDetectsAWrongIndex) {
  const HashEncodingConfig c = make_config(4, 2, 10, 4, 2.0);
  const torch::Tensor table = random_table(c, 7);
  torch::manual_seed(8);
  const torch::Tensor positions = torch::rand({1000, 3});
  const torch::Tensor out = hash_encoding(positions, table, c);
  const torch::Tensor shifted = reference_encoding(positions, table.roll(1, 1), c);
  EXPECT_GT((out - shifted).abs().max().item<double>(), 1e-2);
}

// 1 level, 4 cells per axis, dense (125 <= 128 rows), table[row] = row: the centre of cell
// (1, 2, 3) averages rows x + 5y + 25z over the cell's corners = 1.5 + 5 * 2.5 + 25 * 3.5.
TEST(HashEncoding, HandCheckedDenseCell) {
  const HashEncodingConfig c = make_config(1, 2, 7, 4, 1.0);
  ASSERT_TRUE(hash_grid_levels(c)[0].dense);
  const torch::Tensor rows = torch::arange(128, torch::kFloat32);
  const torch::Tensor table = torch::stack({rows, -2 * rows}, 1).unsqueeze(0);  // [1, 128, 2]
  const torch::Tensor positions =
      torch::tensor({0.375f, 0.625f, 0.875f,   // centre of cell (1, 2, 3)
                     0.25f, 0.5f, 0.75f,       // vertex (1, 2, 3): row 1 + 10 + 75
                     1.0f, 1.0f, 1.0f,         // the last vertex: row 124
                     0.0f, 0.0f, 0.0f})
          .view({4, 3});
  const torch::Tensor out = hash_encoding(positions, table, c);
  EXPECT_FLOAT_EQ(out[0][0].item<float>(), 101.5f);
  EXPECT_FLOAT_EQ(out[0][1].item<float>(), -203.0f);
  EXPECT_FLOAT_EQ(out[1][0].item<float>(), 86.0f);
  EXPECT_FLOAT_EQ(out[2][0].item<float>(), 124.0f);
  EXPECT_FLOAT_EQ(out[3][0].item<float>(), 0.0f);
  // The gradient of out[0][0] is 1/8 at each corner row of cell (1, 2, 3), 0 elsewhere.
  const torch::Tensor e = table.clone().requires_grad_(true);
  hash_encoding(positions.slice(0, 0, 1), e, c).select(1, 0).sum().backward();
  const torch::Tensor g = e.grad().select(0, 0).select(1, 0);
  for (int k = 0; k < 8; ++k) {
    const int64_t row = (1 + (k & 1)) + 5 * (2 + ((k >> 1) & 1)) + 25 * (3 + ((k >> 2) & 1));
    EXPECT_FLOAT_EQ(g[row].item<float>(), 0.125f) << "row " << row;
  }
  EXPECT_FLOAT_EQ(g.sum().item<float>(), 1.0f);
  EXPECT_EQ(e.grad().select(2, 1).abs().sum().item<float>(), 0.0f);
}

// A point on a vertex of a hashed level reads exactly that vertex's row, computed here by hand in
// uint32: 64 cells per axis, 65^3 > 2^10 rows.
TEST(HashEncoding, HandCheckedHashedVertex) {
  const HashEncodingConfig c = make_config(1, 1, 10, 64, 1.0);
  ASSERT_FALSE(hash_grid_levels(c)[0].dense);
  const torch::Tensor table = torch::arange(1024, torch::kFloat32).view({1, 1024, 1});
  const uint32_t x = 5, y = 40, z = 63;
  const uint32_t row = (x ^ (y * 2654435761u) ^ (z * 805459861u)) & 1023u;
  const torch::Tensor positions = torch::tensor({x / 64.0f, y / 64.0f, z / 64.0f}).view({1, 3});
  EXPECT_EQ(hash_encoding(positions, table, c).item<float>(), static_cast<float>(row));
}

TEST(HashEncoding, ResolutionsAndPerLevelScale) {
  EXPECT_DOUBLE_EQ(hash_encoding_per_level_scale(16, 16, 1), 1.0);
  const double b = hash_encoding_per_level_scale(16, 2048, 8);
  EXPECT_NEAR(b, 2.0, 1e-12);
  HashEncodingConfig c = make_config(8, 2, 19, 16, b);
  const auto levels = hash_grid_levels(c);
  ASSERT_EQ(levels.size(), 8u);
  for (int l = 0; l < 8; ++l) {
    EXPECT_EQ(levels[l].resolution, int64_t{16} << l) << "level " << l;  // no floor lost a cell
    EXPECT_EQ(levels[l].dense, l <= 2) << "level " << l;  // 65^3 <= 2^19 < 129^3
  }
  // floor, not round: 3 * 1.5^l = 3, 4.5, 6.75, 10.125.
  c = make_config(4, 2, 19, 3, 1.5);
  const auto odd = hash_grid_levels(c);
  EXPECT_EQ(odd[1].resolution, 4);
  EXPECT_EQ(odd[2].resolution, 6);
  EXPECT_EQ(odd[3].resolution, 10);
  EXPECT_THROW(hash_encoding_per_level_scale(16, 8, 4), c10::Error);

  // The finest resolutions allowed: (N + 1)^3 vertices is past int64 there ((2^21 + 1)^3 wrapped
  // to a negative count once and read as dense), yet every such level is hashed, and a level
  // whose vertices exactly fill the table is dense.
  c = make_config(4, 2, 30, 1 << 21, 2.0);  // 2^21, 2^22, 2^23, 2^24 cells per axis
  const auto finest = hash_grid_levels(c);
  ASSERT_EQ(finest.size(), 4u);
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(finest[l].resolution, int64_t{1} << (21 + l)) << "level " << l;
    EXPECT_FALSE(finest[l].dense) << "level " << l;
  }
  c = make_config(1, 2, 30, 1023, 1.0);  // 1024^3 = 2^30 vertices: the table exactly
  EXPECT_TRUE(hash_grid_levels(c)[0].dense);
  c = make_config(1, 2, 30, 1024, 1.0);  // 1025^3 > 2^30
  EXPECT_FALSE(hash_grid_levels(c)[0].dense);
}

// The CPU backward owns a level per task and walks points in order: bitwise equal for 1 and 2
// threads, on a table small enough that thousands of points share each row.
TEST(HashEncoding, CpuBackwardIsBitwiseDeterministicAcrossThreadCounts) {
  const HashEncodingConfig c = make_config(6, 2, 8, 3, 1.6);
  const torch::Tensor table = random_table(c, 11);
  torch::manual_seed(12);
  const torch::Tensor positions = torch::rand({40000, 3});
  const torch::Tensor cotangent = torch::randn({40000, 12});
  const int threads = at::get_num_threads();
  std::vector<torch::Tensor> outs, grads;
  for (int n : {1, 2, 1}) {
    at::set_num_threads(n);
    auto [out, grad] = run_with_grad(op_encoding, positions, table, c, cotangent);
    outs.push_back(out);
    grads.push_back(grad);
  }
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(outs[0], outs[1]));
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));
  EXPECT_TRUE(torch::equal(grads[0], grads[2]));
  EXPECT_GT(grads[0].abs().sum().item<double>(), 0.0);
}

// The encoding is linear in the table: enc(e1 + e2) = enc(e1) + enc(e2), enc(a e) = a enc(e).
TEST(HashEncoding, LinearInEmbeddings) {
  const HashEncodingConfig c = make_config(6, 2, 11, 4, 1.8);
  const torch::Tensor e1 = random_table(c, 21), e2 = random_table(c, 22);
  torch::manual_seed(23);
  const torch::Tensor positions = torch::rand({3000, 3});
  const torch::Tensor sum = hash_encoding(positions, e1 + e2, c);
  expect_close(sum, hash_encoding(positions, e1, c) + hash_encoding(positions, e2, c), kRtol,
               kAtol, "enc(e1 + e2)");
  expect_close(hash_encoding(positions, 3.0 * e1, c), 3.0 * hash_encoding(positions, e1, c), kRtol,
               kAtol, "enc(3 e1)");
}

// The 8 weights of a point sum to 1, so per level and feature, the table gradient sums to the
// output gradient summed over points (clamped points included).
TEST(HashEncoding, GradientMassIsConserved) {
  const HashEncodingConfig c = make_config(5, 3, 9, 2, 2.2);
  const torch::Tensor table = random_table(c, 31);
  torch::manual_seed(32);
  const torch::Tensor positions = torch::rand({5000, 3}) * 1.4 - 0.2;
  const torch::Tensor cotangent = torch::randn({5000, 15});
  const auto [out, grad] = run_with_grad(op_encoding, positions, table, c, cotangent);
  const torch::Tensor per_table = grad.to(torch::kFloat64).sum(1);  // [L, F]
  const torch::Tensor per_points = cotangent.to(torch::kFloat64).sum(0).view({5, 3});
  expect_close(per_table, per_points, 1e-5, 1e-4, "sum of v_embeddings");
}

// Clamping: a point outside the cube encodes as the nearest point of the cube.
TEST(HashEncoding, OutsidePointsClampToTheCube) {
  const HashEncodingConfig c = make_config(4, 2, 10, 4, 2.0);
  const torch::Tensor table = random_table(c, 41);
  torch::manual_seed(42);
  const torch::Tensor positions = torch::rand({500, 3}) * 4 - 2;
  expect_close(hash_encoding(positions, table, c),
               hash_encoding(positions.clamp(0.0, 1.0), table, c), 0, 0, "clamped");
  // Infinities clamp like any other value; NaN reads as 0 (documented, and never out of bounds).
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const torch::Tensor odd = torch::tensor({inf, -inf, 0.3f, nan, 0.7f, nan}).view({2, 3});
  const torch::Tensor same = torch::tensor({1.0f, 0.0f, 0.3f, 0.0f, 0.7f, 0.0f}).view({2, 3});
  EXPECT_TRUE(torch::equal(hash_encoding(odd, table, c), hash_encoding(same, table, c)));
}

TEST(HashEncoding, NonContiguousInputsMatchContiguous) {
  const HashEncodingConfig c = make_config(4, 2, 10, 4, 2.0);
  const torch::Tensor table = random_table(c, 51);
  torch::manual_seed(52);
  const torch::Tensor wide = torch::rand({700, 5});
  const torch::Tensor positions = wide.slice(1, 1, 4);
  ASSERT_FALSE(positions.is_contiguous());
  const torch::Tensor strided_table =
      torch::stack({table, torch::zeros_like(table)}, 3).select(3, 0);
  ASSERT_FALSE(strided_table.is_contiguous());
  EXPECT_TRUE(torch::equal(hash_encoding(positions, strided_table, c),
                           hash_encoding(positions.contiguous(), table, c)));
  // out.sum() hands backward an expanded (stride 0) gradient.
  const torch::Tensor e = table.clone().requires_grad_(true);
  hash_encoding(positions, e, c).sum().backward();
  const auto [out, grad] = run_with_grad(op_encoding, positions.contiguous(), table, c,
                                         torch::ones({700, 8}));
  EXPECT_TRUE(torch::equal(e.grad(), grad));
}

TEST(HashEncoding, DispatchMatchesCpuImplementation) {
  const HashEncodingConfig c = make_config(3, 2, 9, 4, 2.0);
  const torch::Tensor table = random_table(c, 61);
  torch::manual_seed(62);
  const torch::Tensor positions = torch::rand({300, 3});
  EXPECT_TRUE(torch::equal(hash_encoding(positions, table, c),
                           cpu::hash_encoding_fwd(positions, table, hash_grid_levels(c))));
}

TEST(HashEncoding, EmptyInputs) {
  const HashEncodingConfig c = make_config(3, 2, 9, 4, 2.0);
  const torch::Tensor table = random_table(c, 71).requires_grad_(true);
  const torch::Tensor out = hash_encoding(torch::zeros({0, 3}), table, c);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{0, 6}));
  out.sum().backward();
  EXPECT_EQ(table.grad().sizes(), table.sizes());
  EXPECT_EQ(table.grad().abs().sum().item<float>(), 0.0f);
}

TEST(HashEncoding, WorksWithoutGradMode) {
  const HashEncodingConfig c = make_config(2, 2, 8, 4, 2.0);
  const torch::Tensor table = random_table(c, 81).requires_grad_(true);
  torch::NoGradGuard no_grad;
  const torch::Tensor out =
      hash_encoding(torch::rand({10, 3}).requires_grad_(true), table, c);
  EXPECT_FALSE(out.requires_grad());
}

TEST(HashEncoding, RejectsBadInput) {
  const HashEncodingConfig c = make_config(2, 2, 8, 4, 2.0);
  const torch::Tensor table = random_table(c, 91);
  const torch::Tensor positions = torch::rand({10, 3});
  EXPECT_NO_THROW(hash_encoding(positions, table, c));
  EXPECT_THROW(hash_encoding(positions.view({30}), table, c), c10::Error);
  EXPECT_THROW(hash_encoding(torch::rand({10, 2}), table, c), c10::Error);
  EXPECT_THROW(hash_encoding(positions.to(torch::kFloat64), table, c), c10::Error);
  EXPECT_THROW(hash_encoding(positions, table.to(torch::kFloat16), c), c10::Error);
  EXPECT_THROW(hash_encoding(positions, table.to(torch::kBFloat16), c), c10::Error);
  EXPECT_THROW(hash_encoding(positions, table.to(torch::kFloat64), c), c10::Error);
  EXPECT_THROW(hash_encoding(positions, table.slice(1, 0, 128), c), c10::Error);  // T mismatch
  EXPECT_THROW(hash_encoding(positions, table.slice(0, 0, 1), c), c10::Error);    // L mismatch
  EXPECT_THROW(hash_encoding(positions, table.slice(2, 0, 1), c), c10::Error);    // F mismatch
  EXPECT_THROW(hash_encoding(positions, table[0], c), c10::Error);
  for (const HashEncodingConfig& bad :
       {make_config(0, 2, 8, 4, 2.0), make_config(33, 2, 8, 4, 2.0), make_config(2, 0, 8, 4, 2.0),
        make_config(2, 2, 0, 4, 2.0), make_config(2, 2, 31, 4, 2.0), make_config(2, 2, 8, 0, 2.0),
        make_config(2, 2, 8, 4, 0.5), make_config(2, 2, 8, 4, std::nan("")),
        make_config(30, 2, 8, 16, 4.0)})  // 16 * 4^29 cells per axis
    EXPECT_THROW(hash_grid_levels(bad), c10::Error) << config_name(bad);
  // Positions get no gradient: asking for one is an error, not a silent zero.
  EXPECT_THROW(hash_encoding(positions.clone().requires_grad_(true), table, c), c10::Error);
}

// --- CUDA ------------------------------------------------------------------------------------

TEST(HashEncodingCuda, MatchesCpuForwardAndBackward) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  std::vector<HashEncodingConfig> configs = test_configs();
  configs.push_back(make_config(16, 2, 19, 16, 2.0));  // the default: many blocks, big table
  uint64_t seed = 300;
  for (const HashEncodingConfig& c : configs) {
    const torch::Tensor table = random_table(c, seed++);
    auto sets = point_sets(c, seed++);
    sets.emplace_back("N=200000", torch::rand({200000, 3}));
    for (const auto& [set, positions] : sets) {
      const std::string name = "cuda " + config_name(c) + " " + set;
      torch::manual_seed(seed++);
      const torch::Tensor cotangent =
          torch::randn({positions.size(0), int64_t{c.levels} * c.features_per_level});
      const auto [cpu_out, cpu_grad] = run_with_grad(op_encoding, positions, table, c, cotangent);
      const auto [out, grad] = run_with_grad(op_encoding, positions.to(device), table.to(device),
                                             c, cotangent.to(device));
      ASSERT_TRUE(out.is_cuda()) << name;
      ASSERT_TRUE(grad.is_cuda()) << name;
      expect_close(out.cpu(), cpu_out, kRtol, kAtol, name + " encoding");
      expect_close(grad.cpu(), cpu_grad, kRtol, kAtol, name + " v_embeddings");
    }
  }
}

// Two backward passes over the same inputs give the same bits: the table's rows are summed in
// fixed point with integer atomics, so the order the threads' adds land in cannot show. 600k
// points on the default grid (two launches of 2^19 points): the coarse levels' rows each take
// thousands of contributions.
TEST(HashEncodingCuda, BackwardIsBitwiseRepeatable) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  const HashEncodingConfig c = make_config(16, 2, 19, 16, 2.0);
  const torch::Tensor table = random_table(c, 501, device);
  torch::manual_seed(502);
  const torch::Tensor positions = torch::rand({600000, 3}).to(device);
  const torch::Tensor cotangent =
      torch::randn({600000, int64_t{c.levels} * c.features_per_level}).to(device);
  const auto [out_a, grad_a] = run_with_grad(op_encoding, positions, table, c, cotangent);
  const auto [out_b, grad_b] = run_with_grad(op_encoding, positions, table, c, cotangent);
  EXPECT_TRUE(torch::equal(out_a, out_b));
  EXPECT_TRUE(torch::equal(grad_a, grad_b));
  EXPECT_TRUE(torch::isfinite(grad_a).all().item<bool>());
  EXPECT_GT(grad_a.abs().sum().item<double>(), 0.0);
}

TEST(HashEncodingCuda, MatchesReference) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  const HashEncodingConfig c = make_config(8, 2, 12, 8, 1.9);
  const torch::Tensor table = random_table(c, 401, device);
  torch::manual_seed(402);
  const torch::Tensor positions = (torch::rand({5000, 3}) * 1.2 - 0.1).to(device);
  const torch::Tensor cotangent = torch::randn({5000, 16}).to(device);
  const auto [ref, ref_grad] = run_with_grad(reference_encoding, positions, table, c, cotangent);
  const auto [out, grad] = run_with_grad(op_encoding, positions, table, c, cotangent);
  expect_close(out, ref, kRtol, kAtol, "cuda encoding");
  expect_close(grad, ref_grad, kRtol, kAtol, "cuda v_embeddings");
}

TEST(HashEncodingCuda, EmptyInputs) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const HashEncodingConfig c = make_config(3, 2, 9, 4, 2.0);
  const torch::Device device(torch::kCUDA, 0);
  const torch::Tensor table = random_table(c, 501, device).requires_grad_(true);
  const torch::Tensor out =
      hash_encoding(torch::zeros({0, 3}, torch::TensorOptions().device(device)), table, c);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{0, 6}));
  out.sum().backward();
  EXPECT_EQ(table.grad().sizes(), table.sizes());
  EXPECT_EQ(table.grad().abs().sum().item<float>(), 0.0f);
}

}  // namespace
}  // namespace tessera::kernels
