// Tests of kernels::ray_march against a naive per-ray loop written from the rule in
// kernels/ray_march.h: random rays and grids, hand cases, volume_render layout, threads, CUDA.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/nn/functional.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "kernels/nonfinite.h"
#include "kernels/ray_march.h"
#include "kernels/volume_render.h"
#include "tests/cuda_skip.h"

namespace tessera::kernels {
namespace {

// Tolerance: none. The op and the reference evaluate the same float32 expressions, each op
// rounded once (no FMA on either side), so ray_offsets, ray_indices, ts, deltas and positions
// must agree bitwise; a one-ulp difference would move samples across cell boundaries anyway.

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Rays {
  torch::Tensor origins;     // [R, 3]
  torch::Tensor directions;  // [R, 3]
  torch::Tensor near;        // [R]
  torch::Tensor far;         // [R]
};

Rays make_rays(const std::vector<float>& o, const std::vector<float>& d,
               const std::vector<float>& near, const std::vector<float>& far) {
  const auto n = static_cast<int64_t>(near.size());
  return {torch::tensor(o).view({n, 3}), torch::tensor(d).view({n, 3}), torch::tensor(near),
          torch::tensor(far)};
}

Rays one_ray(std::vector<float> o, std::vector<float> d, float near = 0.0f, float far = kInf) {
  return make_rays(o, d, {near}, {far});
}

torch::Tensor unit_box() { return torch::tensor({0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f}); }

torch::Tensor full_grid(int64_t g) { return torch::ones({g, g, g}, torch::kUInt8); }

RayMarchParams constant_step(float dt, int64_t max_samples = 1 << 20) {
  RayMarchParams p;
  p.step_size = dt;
  p.max_samples_per_ray = max_samples;
  return p;
}

RayMarchOutput march(const Rays& r, const torch::Tensor& aabb, const torch::Tensor& occupancy,
                     const RayMarchParams& p) {
  return ray_march(r.origins, r.directions, r.near, r.far, aabb, occupancy, p);
}

// Random rays around (and through) the box: origins in the box grown by half its size on each
// side, Gaussian directions, a fifth with one or two zero components, half of them not unit
// length; near in [0, 1) with some -inf, far in [1, 8) with some +inf.
Rays random_rays(int64_t n, const std::vector<float>& box, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> o(3 * n), d(3 * n), near(n), far(n);
  for (int64_t r = 0; r < n; ++r) {
    for (int a = 0; a < 3; ++a) {
      const float size = box[a + 3] - box[a];
      o[3 * r + a] = box[a] - 0.5f * size + 2.0f * size * unit(rng);
      d[3 * r + a] = normal(rng);
    }
    if (unit(rng) < 0.2f) d[3 * r + rng() % 3] = 0.0f;
    if (unit(rng) < 0.05f) {  // axis-parallel
      const int keep = static_cast<int>(rng() % 3);
      for (int a = 0; a < 3; ++a)
        if (a != keep) d[3 * r + a] = 0.0f;
      if (d[3 * r + keep] == 0.0f) d[3 * r + keep] = 1.0f;
    }
    const float len = std::sqrt(d[3 * r] * d[3 * r] + d[3 * r + 1] * d[3 * r + 1] +
                                d[3 * r + 2] * d[3 * r + 2]);
    const float scale = unit(rng) < 0.5f ? 1.0f / len : 0.5f + unit(rng);
    for (int a = 0; a < 3; ++a) d[3 * r + a] *= scale;
    near[r] = unit(rng) < 0.1f ? -kInf : unit(rng);
    far[r] = unit(rng) < 0.1f ? kInf : 1.0f + 7.0f * unit(rng);
  }
  return make_rays(o, d, near, far);
}

// A grid with about `density` of its cells occupied, plus one solid blob so that rays through
// the middle keep long runs of samples.
torch::Tensor random_grid(const std::vector<int64_t>& res, double density, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor occ = (torch::rand(res) < density).to(torch::kUInt8);
  occ.slice(0, res[0] / 4, res[0] / 2).slice(1, res[1] / 3, 2 * res[1] / 3).fill_(1);
  return occ;
}

// --- The reference: plain C++, one ray at a time, read from the rule in kernels/ray_march.h ----

struct Reference {
  std::vector<int64_t> offsets{0};
  std::vector<float> ts, deltas, positions;
  std::vector<int64_t> ray_indices;
};

Reference reference_march(const Rays& rays, const torch::Tensor& aabb,
                          const torch::Tensor& occupancy, const RayMarchParams& p) {
  const auto o = rays.origins.accessor<float, 2>();
  const auto d = rays.directions.accessor<float, 2>();
  const auto near = rays.near.accessor<float, 1>();
  const auto far = rays.far.accessor<float, 1>();
  const auto box = aabb.accessor<float, 1>();
  const torch::Tensor occ_u8 = occupancy.to(torch::kUInt8);
  const auto occ = occ_u8.accessor<uint8_t, 3>();
  Reference ref;
  for (int64_t r = 0; r < o.size(0); ++r) {
    std::vector<float> kept_t, kept_dt, kept_p;
    const float ox[3] = {o[r][0], o[r][1], o[r][2]}, dx[3] = {d[r][0], d[r][1], d[r][2]};
    bool valid = p.max_samples_per_ray > 0 && !std::isnan(near[r]) && !std::isnan(far[r]) &&
                 (dx[0] != 0.0f || dx[1] != 0.0f || dx[2] != 0.0f);
    for (int a = 0; a < 3; ++a) valid = valid && std::isfinite(ox[a]) && std::isfinite(dx[a]);
    float t_enter = -kInf, t_exit = kInf;
    for (int a = 0; valid && a < 3; ++a) {
      const float lo = box[a], hi = box[a + 3];
      if (dx[a] == 0.0f) {
        valid = lo <= ox[a] && ox[a] <= hi;
      } else {
        const float t0 = (lo - ox[a]) / dx[a], t1 = (hi - ox[a]) / dx[a];
        t_enter = std::max(t_enter, std::min(t0, t1));
        t_exit = std::min(t_exit, std::max(t0, t1));
      }
    }
    const float t_start = std::max(near[r], t_enter), t_end = std::min(far[r], t_exit);
    for (float t = t_start; valid && t_start < t_end;) {
      const float dt = p.cone_angle > 0.0f
                           ? std::min(std::max(t * p.cone_angle, p.step_size), p.max_step)
                           : p.step_size;
      const float t_next = t + dt;
      if (t_next > t_end || t_next == t) break;
      const float t_mid = t + 0.5f * dt;
      float pos[3], look[3];
      int64_t cell[3];
      for (int a = 0; a < 3; ++a) look[a] = pos[a] = ox[a] + t_mid * dx[a];
      if (p.contract) {  // the grid spans the contracted cube [-2, 2]^3
        const float m = std::max({std::fabs(pos[0]), std::fabs(pos[1]), std::fabs(pos[2])});
        if (m > 1.0f)
          for (float& v : look) v = v * ((2.0f - 1.0f / m) / m);
      }
      for (int a = 0; a < 3; ++a) {
        const int64_t g = occupancy.size(a);
        const float lo = p.contract ? -2.0f : box[a], hi = p.contract ? 2.0f : box[a + 3];
        const float scale = static_cast<float>(g) / (hi - lo);
        cell[a] = std::clamp<int64_t>(
            static_cast<int64_t>(std::floor((look[a] - lo) * scale)), 0, g - 1);
      }
      if (occ[cell[0]][cell[1]][cell[2]]) {
        kept_t.push_back(t_mid);
        kept_dt.push_back(dt);
        kept_p.insert(kept_p.end(), pos, pos + 3);
        if (static_cast<int64_t>(kept_t.size()) == p.max_samples_per_ray) break;
      }
      t = t_next;
    }
    ref.ts.insert(ref.ts.end(), kept_t.begin(), kept_t.end());
    ref.deltas.insert(ref.deltas.end(), kept_dt.begin(), kept_dt.end());
    ref.positions.insert(ref.positions.end(), kept_p.begin(), kept_p.end());
    ref.ray_indices.insert(ref.ray_indices.end(), kept_t.size(), r);
    ref.offsets.push_back(ref.offsets.back() + static_cast<int64_t>(kept_t.size()));
  }
  return ref;
}

// Bitwise equality of two tensors, reporting how many elements differ and the first one.
void expect_same(const torch::Tensor& actual, const torch::Tensor& expected,
                 const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  if (expected.numel() == 0) return;
  const torch::Tensor a = actual.cpu().reshape(-1), e = expected.cpu().reshape(-1);
  const torch::Tensor differ = a != e;
  const int64_t bad = differ.sum().item<int64_t>();
  if (bad == 0) return;
  const int64_t first = differ.nonzero()[0][0].item<int64_t>();
  ADD_FAILURE() << what << ": " << bad << " of " << e.numel() << " elements differ; first at "
                << first << ": " << a[first].item<double>() << " vs " << e[first].item<double>();
}

void expect_same_outputs(const RayMarchOutput& a, const RayMarchOutput& b, const std::string& what) {
  expect_same(a.ray_offsets, b.ray_offsets, what + " ray_offsets");
  expect_same(a.ray_indices, b.ray_indices, what + " ray_indices");
  expect_same(a.ts, b.ts, what + " ts");
  expect_same(a.deltas, b.deltas, what + " deltas");
  expect_same(a.positions, b.positions, what + " positions");
}

void expect_matches_reference(const RayMarchOutput& out, const Reference& ref,
                              const std::string& what) {
  const auto n = static_cast<int64_t>(ref.ts.size());
  expect_same(out.ray_offsets, torch::tensor(ref.offsets, torch::kInt64), what + " ray_offsets");
  expect_same(out.ray_indices, torch::tensor(ref.ray_indices, torch::kInt64),
              what + " ray_indices");
  expect_same(out.ts, torch::tensor(ref.ts).view({n}), what + " ts");
  expect_same(out.deltas, torch::tensor(ref.deltas).view({n}), what + " deltas");
  expect_same(out.positions, torch::tensor(ref.positions).view({n, 3}), what + " positions");
}

struct Case {
  std::string name;
  int64_t rays;
  std::vector<float> box;
  std::vector<int64_t> res;
  double density;
  RayMarchParams params;
};

std::vector<Case> random_cases() {
  RayMarchParams fine = constant_step(std::sqrt(3.0f) / 256.0f);
  RayMarchParams capped = constant_step(0.01f, 7);
  RayMarchParams cone = constant_step(0.005f);
  cone.cone_angle = 1.0f / 64.0f;
  cone.max_step = 0.05f;
  RayMarchParams cone_unbounded = constant_step(0.02f, 64);
  cone_unbounded.cone_angle = 0.1f;
  // Scene contraction: the grid covers [-2, 2]^3 of contracted space, the box only clips; rays
  // start inside and outside the foreground cube [-1, 1]^3 and run out to a box of 16.
  RayMarchParams contracted = constant_step(0.0135f, 256);
  contracted.cone_angle = 1.0f / 128.0f;
  contracted.contract = true;
  return {
      {"no rays", 0, {-1, -1, -1, 1, 1, 1}, {8, 8, 8}, 0.3, fine},
      {"cubic", 500, {-1, -1, -1, 1, 1, 1}, {16, 16, 16}, 0.3, fine},
      {"non-cubic box and grid", 500, {-2.0f, 0.5f, -0.25f, 1.0f, 1.5f, 3.0f}, {7, 12, 5}, 0.4,
       fine},
      {"capped", 300, {-1, -1, -1, 1, 1, 1}, {32, 32, 32}, 0.6, capped},
      {"cone", 300, {-1, -1, -1, 1, 1, 1}, {32, 32, 32}, 0.5, cone},
      {"cone without max_step", 300, {0, 0, 0, 4, 4, 4}, {10, 10, 10}, 0.5, cone_unbounded},
      {"one cell", 200, {-1, -1, -1, 1, 1, 1}, {1, 1, 1}, 1.0, fine},
      {"sparse fine grid", 400, {-1, -1, -1, 1, 1, 1}, {64, 64, 64}, 0.02, fine},
      {"contracted", 400, {-16, -16, -16, 16, 16, 16}, {16, 16, 16}, 0.3, contracted},
      {"contracted, rays near the foreground", 400, {-1.5f, -1.5f, -1.5f, 1.5f, 1.5f, 1.5f},
       {32, 32, 32}, 0.2, contracted},
  };
}

TEST(RayMarch, MatchesReferenceOnRandomRaysAndGrids) {
  uint64_t seed = 1;
  int64_t total_samples = 0;
  for (const Case& c : random_cases()) {
    const Rays rays = random_rays(c.rays, c.box, seed++);
    const torch::Tensor aabb = torch::tensor(c.box);
    const torch::Tensor occ = random_grid(c.res, c.density, seed++);
    const RayMarchOutput out = march(rays, aabb, occ, c.params);
    expect_matches_reference(out, reference_march(rays, aabb, occ, c.params), c.name);
    total_samples += out.ts.size(0);
  }
  EXPECT_GT(total_samples, 10000);  // the cases do produce samples
}

// The comparison can fail: a reference that reads the grid as [z][y][x] disagrees.
TEST(RayMarch, ReferenceComparisonDetectsATransposedGrid) {
  const Rays rays = random_rays(300, {-1, -1, -1, 1, 1, 1}, 5);
  const torch::Tensor aabb = torch::tensor({-1.0f, -1.0f, -1.0f, 1.0f, 1.0f, 1.0f});
  const torch::Tensor occ = random_grid({16, 16, 16}, 0.3, 6);
  const RayMarchParams p = constant_step(0.01f);
  const Reference transposed = reference_march(rays, aabb, occ.permute({2, 1, 0}), p);
  EXPECT_FALSE(torch::equal(march(rays, aabb, occ, p).ray_offsets,
                            torch::tensor(transposed.offsets, torch::kInt64)));
}

TEST(RayMarch, RayMissingTheBoxHasNoSamples) {
  // Passes beside the box; points away from it; parallel to a face outside the slab.
  const Rays rays = make_rays({-1, 2, 0.5f, -1, 0.5f, 0.5f, 0.5f, 0.5f, 2},
                              {1, 0.1f, 0, -1, 0, 0, 1, 0, 0}, {0, 0, 0}, {kInf, kInf, kInf});
  const RayMarchOutput out = march(rays, unit_box(), full_grid(4), constant_step(0.01f));
  EXPECT_TRUE(torch::equal(out.ray_offsets, torch::zeros({4}, torch::kInt64)));
  EXPECT_EQ(out.ts.size(0), 0);
  EXPECT_EQ(out.positions.sizes(), (std::vector<int64_t>{0, 3}));
}

// Fully occupied: floor((t_end - t_start) / dt) samples, the last partial step dropped. The ray
// enters at t = 1 and leaves at t = 2; every value below is exact in float.
TEST(RayMarch, FullyOccupiedGridGivesWholeSteps) {
  const Rays ray = one_ray({-1, 0.5f, 0.5f}, {1, 0, 0});
  for (const auto& [dt, expected] : std::vector<std::pair<float, int64_t>>{
           {0.0625f, 16}, {0.25f, 4}, {0.375f, 2}, {1.0f, 1}, {1.5f, 0}}) {
    const RayMarchOutput out = march(ray, unit_box(), full_grid(8), constant_step(dt));
    ASSERT_EQ(out.ts.size(0), expected) << "dt = " << dt;
    for (int64_t k = 0; k < expected; ++k) {
      EXPECT_EQ(out.ts[k].item<float>(), 1.0f + (static_cast<float>(k) + 0.5f) * dt);
      EXPECT_EQ(out.deltas[k].item<float>(), dt);
      EXPECT_EQ(out.positions[k][0].item<float>(), -1.0f + out.ts[k].item<float>());
      EXPECT_EQ(out.positions[k][1].item<float>(), 0.5f);
    }
  }
}

TEST(RayMarch, EmptyGridHasNoSamples) {
  const Rays rays = random_rays(200, {0, 0, 0, 1, 1, 1}, 7);
  const RayMarchOutput out =
      march(rays, unit_box(), torch::zeros({8, 8, 8}, torch::kUInt8), constant_step(0.01f));
  EXPECT_EQ(out.ts.size(0), 0);
  EXPECT_TRUE(torch::equal(out.ray_offsets, torch::zeros({201}, torch::kInt64)));
}

// One occupied cell: every sample lies inside it, and rays aimed through it do get samples.
TEST(RayMarch, SingleOccupiedCellGivesSamplesOnlyInsideIt) {
  torch::Tensor occ = torch::zeros({8, 8, 8}, torch::kUInt8);
  occ[3][4][5] = 1;  // x in [3/8, 4/8), y in [4/8, 5/8), z in [5/8, 6/8)
  Rays rays = random_rays(300, {0, 0, 0, 1, 1, 1}, 8);
  // Half the rays pass through the cell's centre.
  const torch::Tensor centre = torch::tensor({3.5f / 8, 4.5f / 8, 5.5f / 8});
  rays.directions.slice(0, 0, 150).copy_(
      torch::nn::functional::normalize(centre - rays.origins.slice(0, 0, 150),
                                       torch::nn::functional::NormalizeFuncOptions().dim(1)));
  rays.near.slice(0, 0, 150).fill_(0.0f);
  rays.far.slice(0, 0, 150).fill_(kInf);
  const RayMarchOutput out = march(rays, unit_box(), occ, constant_step(0.01f));
  const torch::Tensor cells = (out.positions * 8).floor();
  EXPECT_TRUE((cells == torch::tensor({3.0f, 4.0f, 5.0f})).all().item<bool>());
  const torch::Tensor counts = out.ray_offsets.slice(0, 1) - out.ray_offsets.slice(0, 0, -1);
  EXPECT_TRUE((counts.slice(0, 0, 150) > 0).all().item<bool>());
  EXPECT_GE(counts.slice(0, 0, 150).min().item<int64_t>(), 5);  // the cell is 0.125 wide
}

TEST(RayMarch, MaxSamplesPerRayCapsTheCount) {
  const Rays rays = random_rays(200, {0, 0, 0, 1, 1, 1}, 9);
  const RayMarchOutput all = march(rays, unit_box(), full_grid(4), constant_step(0.01f));
  const RayMarchOutput capped = march(rays, unit_box(), full_grid(4), constant_step(0.01f, 5));
  const torch::Tensor n_all = all.ray_offsets.slice(0, 1) - all.ray_offsets.slice(0, 0, -1);
  const torch::Tensor n_cap = capped.ray_offsets.slice(0, 1) - capped.ray_offsets.slice(0, 0, -1);
  EXPECT_TRUE(torch::equal(n_cap, torch::clamp_max(n_all, 5)));
  EXPECT_GT(n_all.max().item<int64_t>(), 5);
  // The capped samples are the first ones of each ray.
  for (int64_t r = 0; r < 200; ++r) {
    const int64_t a = all.ray_offsets[r].item<int64_t>(), c = capped.ray_offsets[r].item<int64_t>();
    const int64_t n = n_cap[r].item<int64_t>();
    EXPECT_TRUE(torch::equal(capped.ts.slice(0, c, c + n), all.ts.slice(0, a, a + n)));
  }
  const RayMarchOutput none = march(rays, unit_box(), full_grid(4), constant_step(0.01f, 0));
  EXPECT_EQ(none.ts.size(0), 0);
}

// near and far clip the marched segment: samples lie in [near, far], starting at near.
TEST(RayMarch, NearAndFarClip) {
  const Rays ray = one_ray({-1, 0.5f, 0.5f}, {1, 0, 0}, 1.25f, 1.75f);
  const RayMarchOutput out = march(ray, unit_box(), full_grid(8), constant_step(0.0625f));
  ASSERT_EQ(out.ts.size(0), 8);  // (1.75 - 1.25) / 0.0625
  EXPECT_EQ(out.ts[0].item<float>(), 1.25f + 0.03125f);
  EXPECT_EQ(out.ts[7].item<float>(), 1.75f - 0.03125f);
  // far before the box, near after it: nothing.
  EXPECT_EQ(march(one_ray({-1, 0.5f, 0.5f}, {1, 0, 0}, 0.0f, 0.9f), unit_box(), full_grid(8),
                  constant_step(0.0625f)).ts.size(0), 0);
  EXPECT_EQ(march(one_ray({-1, 0.5f, 0.5f}, {1, 0, 0}, 2.5f, 9.0f), unit_box(), full_grid(8),
                  constant_step(0.0625f)).ts.size(0), 0);
}

// A ray starting inside the box marches from near (t_enter is behind the origin).
TEST(RayMarch, RayStartingInsideTheBox) {
  const Rays ray = one_ray({0.5f, 0.5f, 0.5f}, {0, 0, -1}, 0.0f);
  const RayMarchOutput out = march(ray, unit_box(), full_grid(8), constant_step(0.0625f));
  ASSERT_EQ(out.ts.size(0), 8);
  EXPECT_EQ(out.ts[0].item<float>(), 0.03125f);
  EXPECT_EQ(out.positions[0][2].item<float>(), 0.5f - 0.03125f);
  EXPECT_EQ(out.positions[7][2].item<float>(), 0.03125f);
}

// Directions with zero components: no NaN, the right segment, and origins on a face count as
// inside (lo <= o <= hi) while origins outside the slab miss.
TEST(RayMarch, AxisParallelDirectionsHaveNoNaN) {
  const Rays rays = make_rays({0.25f, 0.75f, -1, 0, 0.5f, -1, 1, 1, -1, 1.5f, 0.5f, -1, 0.5f, 0.5f, 0.5f},
                              {0, 0, 2, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0},
                              {0, 0, 0, 0, 0}, {kInf, kInf, kInf, kInf, kInf});
  const RayMarchOutput out = march(rays, unit_box(), full_grid(8), constant_step(0.0625f));
  // Ray 0 travels at speed 2: the box is t in [0.5, 1], 8 steps. Rays 1, 2 run along faces and
  // edges: t in [1, 2], 16 steps. Ray 3 is outside the x slab; ray 4 has no direction.
  EXPECT_TRUE(torch::equal(out.ray_offsets, torch::tensor({0, 8, 24, 40, 40, 40}, torch::kInt64)));
  EXPECT_EQ(count_nonfinite(out.ts).item<int64_t>(), 0);
  EXPECT_EQ(count_nonfinite(out.positions).item<int64_t>(), 0);
  EXPECT_EQ(out.positions[23][0].item<float>(), 0.0f);
  EXPECT_EQ(out.positions[39][1].item<float>(), 1.0f);
}

TEST(RayMarch, NonFiniteRaysHaveNoSamples) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Rays rays = make_rays({nan, 0.5f, 0.5f, -1, 0.5f, 0.5f, -1, 0.5f, 0.5f, -kInf, 0.5f, 0.5f},
                              {1, 0, 0, 1, nan, 0, 1, 0, 0, 1, 0, 0}, {0, 0, nan, 0},
                              {kInf, kInf, kInf, kInf});
  const RayMarchOutput out = march(rays, unit_box(), full_grid(8), constant_step(0.0625f));
  EXPECT_EQ(out.ts.size(0), 0);
}

// Cone tracing: dt = clamp(t * cone_angle, step_size, max_step) at the start of each step.
TEST(RayMarch, ConeTracingStepsGrowWithT) {
  RayMarchParams p = constant_step(0.01f);
  p.cone_angle = 0.02f;
  p.max_step = 0.03f;
  const Rays ray = one_ray({0.5f, 0.5f, -0.001f}, {0, 0, 1}, 0.0f);
  const RayMarchOutput out =
      march(ray, torch::tensor({0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 2.0f}), full_grid(4), p);
  ASSERT_GT(out.ts.size(0), 10);
  const torch::Tensor start = out.ts - 0.5 * out.deltas;
  const torch::Tensor expected = torch::clamp(start * p.cone_angle, p.step_size, p.max_step);
  EXPECT_TRUE(torch::allclose(out.deltas, expected, 1e-6, 0));
  EXPECT_EQ(out.deltas[0].item<float>(), 0.01f);
  EXPECT_EQ(out.deltas[-1].item<float>(), 0.03f);
  EXPECT_TRUE((out.deltas.slice(0, 1) >= out.deltas.slice(0, 0, -1)).all().item<bool>());
}

// The outputs feed volume_render directly. On a fully occupied grid each ray keeps every whole
// step: n = floor((t_end - t_start) / dt), checked against the segment computed in double, and
// with constant sigma the opacity is 1 - exp(-sigma * n * dt).
// With contraction a far sample is looked up in the outer shell of the grid, not clamped into
// the border cell of the aabb: a ray along +x from the origin to x = 100 keeps samples only
// where the contracted grid is occupied.
TEST(RayMarch, ContractionLooksUpTheContractedPosition) {
  RayMarchParams p = constant_step(0.05f, 100000);
  p.cone_angle = 1.0f / 32.0f;
  p.contract = true;
  torch::Tensor occ = torch::zeros({8, 8, 8}, torch::kUInt8);  // cells of width 0.5 over [-2, 2]
  occ[7][4][4] = 1;  // contracted x in [1.5, 2): world x in [2, inf)
  const Rays rays = make_rays({0, 0.1f, 0.1f}, {1, 0, 0}, {0}, {100});
  const RayMarchOutput out = march(rays, torch::tensor({-200.0f, -200.0f, -200.0f, 200.0f, 200.0f, 200.0f}), occ, p);
  ASSERT_GT(out.ts.size(0), 0);
  EXPECT_GE(out.positions.select(1, 0).min().item<float>(), 2.0f);
  EXPECT_LE(out.ts.max().item<float>(), 100.0f);
  // Without contraction the same grid spans the aabb: x in [150, 200), beyond far: nothing.
  p.contract = false;
  EXPECT_EQ(march(rays, torch::tensor({-200.0f, -200.0f, -200.0f, 200.0f, 200.0f, 200.0f}), occ, p).ts.size(0), 0);
}

TEST(RayMarch, OutputsFeedVolumeRender) {
  constexpr float kStep = 1.0f / 128;
  const Rays rays = random_rays(256, {0, 0, 0, 1, 1, 1}, 10);
  const RayMarchOutput out = march(rays, unit_box(), full_grid(16), constant_step(kStep));
  ASSERT_GT(out.ts.size(0), 1000);
  const torch::Tensor counts = out.ray_offsets.slice(0, 1) - out.ray_offsets.slice(0, 0, -1);

  // Whole steps in exact arithmetic (double): float accumulation of t may differ by one step
  // when the segment is within rounding of a multiple of dt, which random rays almost never are.
  int64_t off_by_one = 0;
  for (int64_t r = 0; r < 256; ++r) {
    double t_enter = -INFINITY, t_exit = INFINITY;
    bool hit = true;
    for (int a = 0; a < 3; ++a) {
      const double o = rays.origins[r][a].item<float>(), d = rays.directions[r][a].item<float>();
      if (d == 0.0) {
        hit = hit && 0.0 <= o && o <= 1.0;
        continue;
      }
      t_enter = std::max(t_enter, std::min(-o / d, (1.0 - o) / d));
      t_exit = std::min(t_exit, std::max(-o / d, (1.0 - o) / d));
    }
    const double t0 = std::max<double>(rays.near[r].item<float>(), t_enter);
    const double t1 = std::min<double>(rays.far[r].item<float>(), t_exit);
    const int64_t whole = hit && t0 < t1 ? static_cast<int64_t>(std::floor((t1 - t0) / kStep)) : 0;
    const int64_t n = counts[r].item<int64_t>();
    EXPECT_LE(std::abs(n - whole), 1) << "ray " << r;
    off_by_one += n != whole;
  }
  EXPECT_LE(off_by_one, 3);

  const int64_t n = out.ts.size(0);
  constexpr double kSigma = 3.0;
  const torch::Tensor sigmas = torch::full({n}, kSigma);
  const torch::Tensor rgbs = torch::full({n, 3}, 0.5f);
  const VolumeRenderOutput vr =
      volume_render(sigmas, rgbs, out.deltas, out.ts, out.ray_offsets, 0.0);
  const torch::Tensor analytic = 1 - torch::exp(-kSigma * kStep * counts.to(torch::kFloat64));
  // float32 compositing multiplies up to ~230 factors exp(-sigma dt): a few 1e-6 of error.
  EXPECT_TRUE(torch::allclose(vr.opacity.to(torch::kFloat64), analytic, 0, 2e-5))
      << (vr.opacity.to(torch::kFloat64) - analytic).abs().max().item<double>();
  EXPECT_GT(vr.opacity.max().item<float>(), 0.5f);
  // depth / opacity is the expected t, between the ray's first and last sample.
  for (int64_t r = 0; r < 256; ++r) {
    const int64_t a = out.ray_offsets[r].item<int64_t>(), b = out.ray_offsets[r + 1].item<int64_t>();
    if (a == b) continue;
    const float mean_t = vr.depth[r].item<float>() / vr.opacity[r].item<float>();
    EXPECT_GE(mean_t, out.ts[a].item<float>() - 1e-4f);
    EXPECT_LE(mean_t, out.ts[b - 1].item<float>() + 1e-4f);
  }
}

TEST(RayMarch, IndependentOfThreadCount) {
  const Rays rays = random_rays(3000, {-1, -1, -1, 1, 1, 1}, 11);
  const torch::Tensor aabb = torch::tensor({-1.0f, -1.0f, -1.0f, 1.0f, 1.0f, 1.0f});
  const torch::Tensor occ = random_grid({32, 32, 32}, 0.3, 12);
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  const RayMarchOutput one = march(rays, aabb, occ, constant_step(0.005f));
  torch::set_num_threads(2);
  const RayMarchOutput two = march(rays, aabb, occ, constant_step(0.005f));
  torch::set_num_threads(threads);
  ASSERT_GT(one.ts.size(0), 0);
  expect_same_outputs(one, two, "1 vs 2 threads");
}

TEST(RayMarch, BoolAndUint8GridsAndStridedInputsAgree) {
  const Rays rays = random_rays(200, {0, 0, 0, 1, 1, 1}, 13);
  const torch::Tensor occ = random_grid({8, 8, 8}, 0.3, 14);
  const RayMarchParams p = constant_step(0.01f);
  const RayMarchOutput base = march(rays, unit_box(), occ, p);
  expect_same_outputs(march(rays, unit_box(), occ.to(torch::kBool), p), base, "bool grid");
  // Strided: every second row of a longer tensor, and a transposed copy of the grid.
  const auto strided = [](const torch::Tensor& t) {
    return torch::stack({t, torch::zeros_like(t)}, 1).select(1, 0);
  };
  const Rays s{strided(rays.origins), strided(rays.directions), strided(rays.near),
               strided(rays.far)};
  ASSERT_FALSE(s.origins.is_contiguous());
  const torch::Tensor occ_strided = occ.permute({2, 1, 0}).contiguous().permute({2, 1, 0});
  ASSERT_FALSE(occ_strided.is_contiguous());
  expect_same_outputs(march(s, unit_box(), occ_strided, p), base, "strided inputs");
}

TEST(RayMarch, DispatchMatchesCpuImplementation) {
  const Rays rays = random_rays(100, {0, 0, 0, 1, 1, 1}, 15);
  const torch::Tensor occ = random_grid({8, 8, 8}, 0.3, 16);
  const RayMarchParams p = constant_step(0.01f);
  expect_same_outputs(
      march(rays, unit_box(), occ, p),
      cpu::ray_march_fwd(rays.origins, rays.directions, rays.near, rays.far, unit_box(), occ, p),
      "dispatch");
}

TEST(RayMarch, RejectsBadInput) {
  const Rays r = random_rays(4, {0, 0, 0, 1, 1, 1}, 17);
  const torch::Tensor box = unit_box(), occ = full_grid(4);
  const RayMarchParams p = constant_step(0.01f);
  const auto run = [&](const torch::Tensor& o, const torch::Tensor& d, const torch::Tensor& n,
                       const torch::Tensor& f, const torch::Tensor& b, const torch::Tensor& g,
                       const RayMarchParams& q) { return ray_march(o, d, n, f, b, g, q); };
  EXPECT_THROW(run(r.origins.view({4, 3, 1}), r.directions, r.near, r.far, box, occ, p), c10::Error);
  EXPECT_THROW(run(r.origins, r.directions.slice(0, 0, 3), r.near, r.far, box, occ, p), c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near.slice(0, 0, 3), r.far, box, occ, p), c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far.view({4, 1}), box, occ, p), c10::Error);
  EXPECT_THROW(run(r.origins.to(torch::kFloat64), r.directions, r.near, r.far, box, occ, p),
               c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far, box.slice(0, 0, 5), occ, p), c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far,
                   torch::tensor({0.0f, 0.0f, 0.0f, 1.0f, 0.0f, 1.0f}), occ, p), c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far,
                   torch::tensor({0.0f, 0.0f, 0.0f, 1.0f, kInf, 1.0f}), occ, p), c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far, box, occ.to(torch::kFloat32), p),
               c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far, box, occ[0], p), c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far, box,
                   torch::zeros({0, 4, 4}, torch::kUInt8), p), c10::Error);
  for (const float bad : {0.0f, -0.1f, kInf, std::numeric_limits<float>::quiet_NaN()})
    EXPECT_THROW(run(r.origins, r.directions, r.near, r.far, box, occ, constant_step(bad)),
                 c10::Error);
  RayMarchParams q = p;
  q.cone_angle = -1.0f;
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far, box, occ, q), c10::Error);
  q = p;
  q.cone_angle = 0.1f;
  q.max_step = 0.001f;
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far, box, occ, q), c10::Error);
  EXPECT_THROW(run(r.origins, r.directions, r.near, r.far, box, occ, constant_step(0.01f, -1)),
               c10::Error);
  EXPECT_NO_THROW(run(r.origins, r.directions, r.near, r.far, box, occ, p));
}

// --- CUDA ------------------------------------------------------------------------------------

// Bitwise: the CUDA kernels round every op as the CPU does (no FMA).
TEST(RayMarchCuda, MatchesCpuBitwise) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device dev(torch::kCUDA, 0);
  uint64_t seed = 100;
  std::vector<Case> cases = random_cases();
  cases.push_back({"many blocks, 128^3", 20000, {-1, -1, -1, 1, 1, 1}, {128, 128, 128}, 0.2,
                   constant_step(std::sqrt(3.0f) / 512.0f)});
  for (const Case& c : cases) {
    const Rays rays = random_rays(c.rays, c.box, seed++);
    const torch::Tensor aabb = torch::tensor(c.box);
    const torch::Tensor occ = random_grid(c.res, c.density, seed++);
    const RayMarchOutput cpu_out = march(rays, aabb, occ, c.params);
    const RayMarchOutput out = ray_march(rays.origins.to(dev), rays.directions.to(dev),
                                         rays.near.to(dev), rays.far.to(dev), aabb.to(dev),
                                         occ.to(torch::kBool).to(dev), c.params);
    ASSERT_TRUE(out.ts.is_cuda() && out.ray_offsets.is_cuda()) << c.name;
    expect_same_outputs(out, cpu_out, "cuda " + c.name);
  }
}

TEST(RayMarchCuda, EmptyInputs) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device dev(torch::kCUDA, 0);
  const auto f32 = torch::dtype(torch::kFloat32).device(dev);
  for (const float density : {0.0f, 1.0f}) {
    const RayMarchOutput none = ray_march(
        torch::zeros({0, 3}, f32), torch::zeros({0, 3}, f32), torch::zeros({0}, f32),
        torch::zeros({0}, f32), unit_box(), torch::full({4, 4, 4}, density, f32).to(torch::kUInt8),
        constant_step(0.01f));
    EXPECT_EQ(none.ray_offsets.sizes(), (std::vector<int64_t>{1}));
    EXPECT_EQ(none.ray_offsets.cpu()[0].item<int64_t>(), 0);
    EXPECT_EQ(none.ts.size(0), 0);
  }
  const Rays rays = random_rays(50, {0, 0, 0, 1, 1, 1}, 18);
  const RayMarchOutput empty =
      ray_march(rays.origins.to(dev), rays.directions.to(dev), rays.near.to(dev),
                rays.far.to(dev), unit_box(), torch::zeros({4, 4, 4}, torch::kUInt8).to(dev),
                constant_step(0.01f));
  EXPECT_TRUE(torch::equal(empty.ray_offsets.cpu(), torch::zeros({51}, torch::kInt64)));
}

}  // namespace
}  // namespace tessera::kernels
