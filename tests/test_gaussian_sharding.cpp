// Gaussian sharding (models/gaussians/gaussian_sharding*.h) against single-process references that every
// rank replays from world-size-independent data. Runs under mpiexec -n 1, 2, 3 and 4 (MPI backend).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/errors.h"
#include "models/gaussians/gaussian_sharding.h"
#include "models/gaussians/gaussian_sharding_exchange.h"
#include "tests/mpi_test_env.h"

namespace tessera::models::gaussians {
namespace {

distributed::Communicator& comm() { return test::cpu_world(); }
int rank() { return comm().rank(); }
int size() { return comm().size(); }

// Logs the number of elements outside |got - want| <= atol + rtol |want| and fails unless zero.
// With rtol = atol = 0 the comparison is exact (bool and integer tensors compare as float64).
void report(const std::string& what, const torch::Tensor& got, const torch::Tensor& want,
            double rtol = 0.0, double atol = 0.0) {
  int64_t wrong = 0;
  if (!got.defined() || got.sizes() != want.sizes()) {
    wrong = std::max<int64_t>(want.numel(), 1);
    std::fprintf(stderr, "[rank %d] %s: shape %s, want %s\n", rank(), what.c_str(),
                 got.defined() ? c10::str(got.sizes()).c_str() : "undefined",
                 c10::str(want.sizes()).c_str());
  } else if (want.numel() > 0) {
    const torch::Tensor g = got.detach().to(torch::kFloat64), w = want.detach().to(torch::kFloat64);
    wrong = ((g - w).abs() > atol + rtol * w.abs()).sum().item<int64_t>() +
            (g.isnan() != w.isnan()).sum().item<int64_t>();
  }
  if (wrong != 0)
    std::fprintf(stderr, "[rank %d] %s: %lld wrong of %lld elements\n", rank(), what.c_str(),
                 static_cast<long long>(wrong), static_cast<long long>(want.numel()));
  EXPECT_EQ(wrong, 0) << what;
}

// Every rank's flag, agreed: true only when it is true on all ranks.
bool all_ranks(bool ok) {
  torch::Tensor t = torch::tensor({static_cast<int64_t>(ok)}, torch::kInt64);
  comm().allreduce(t, distributed::ReduceOp::Min);
  return t.item<int64_t>() == 1;
}

const double kNaN = std::nan("");
const double kInf = std::numeric_limits<double>::infinity();

torch::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// ---------------------------------------------------------------------------------------------
// Morton codes and balanced splits.

// Bit by bit: axis a's bit b goes to bit 3b + a.
int64_t naive_morton(const double* p, const SceneBounds& box, int bits) {
  int64_t code = 0;
  const double top = std::ldexp(1.0, bits) - 1.0;
  for (int a = 0; a < 3; ++a) {
    double q = 0.0;
    const double extent = box.hi[a] - box.lo[a];
    if (extent > 0.0) {
      q = std::floor((p[a] - box.lo[a]) / extent * std::ldexp(1.0, bits));
      if (std::isnan(q)) q = 0.0;
      q = std::min(std::max(q, 0.0), top);
    }
    const int64_t qi = static_cast<int64_t>(q);
    for (int b = 0; b < bits; ++b) code |= ((qi >> b) & 1) << (3 * b + a);
  }
  return code;
}

TEST(GaussianSharding, MortonCodesMatchBitLoop) {
  SceneBounds box;  // power-of-two extents: quantization is exact whichever way it is written
  box.lo[0] = -2.0, box.hi[0] = 6.0;
  box.lo[1] = 0.0, box.hi[1] = 1.0;
  box.lo[2] = -0.5, box.hi[2] = 3.5;
  auto gen = generator(7);
  torch::Tensor p = torch::rand({500, 3}, gen, torch::kFloat64) * 10.0 - 3.0;  // some outside
  p[0] = torch::tensor({-2.0, 0.0, -0.5}, torch::kFloat64);       // lo corner -> 0
  p[1] = torch::tensor({6.0, 1.0, 3.5}, torch::kFloat64);         // hi corner -> all ones
  p[2] = torch::tensor({kNaN, 0.5, kInf}, torch::kFloat64);    // NaN -> 0, +inf -> top
  p[3] = torch::tensor({-kInf, 0.999999, 1.0}, torch::kFloat64);
  for (const int bits : {kMortonBits30, kMortonBits63, 1, 5}) {
    for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
      const torch::Tensor pts = p.to(dtype);
      const torch::Tensor got = morton_codes(pts, box, bits);
      const torch::Tensor exact = pts.to(torch::kFloat64).contiguous();
      std::vector<int64_t> want(pts.size(0));
      for (int64_t i = 0; i < pts.size(0); ++i)
        want[i] = naive_morton(exact.data_ptr<double>() + 3 * i, box, bits);
      report("morton bits " + std::to_string(bits), got, torch::tensor(want, torch::kInt64));
      EXPECT_EQ(got[0].item<int64_t>(), 0);
      // All 3 * bits low bits set (63 bits at most: computed unsigned, 2^63 is past int64).
      EXPECT_EQ(got[1].item<int64_t>(), static_cast<int64_t>((uint64_t{1} << (3 * bits)) - 1));
    }
  }
  SceneBounds flat = box;
  flat.hi[1] = flat.lo[1];  // a flat axis quantizes to 0
  const torch::Tensor got = morton_codes(p, flat, 4);
  EXPECT_EQ(got.bitwise_and(0b010010010010).sum().item<int64_t>(), 0);
  EXPECT_EQ(morton_codes(torch::zeros({0, 3}), box).numel(), 0);
  EXPECT_THROW(morton_codes(p, box, 22), UserError);
  EXPECT_THROW(morton_codes(torch::zeros({4, 2}), box), UserError);
}

// Checks that the boundaries cover [0, T) in order and that each part's cost is within the
// largest single cost of the mean (the guarantee of the nearest-target rule).
void check_balanced(const std::string& what, const std::vector<double>& costs,
                    const std::vector<int64_t>& b, int parts) {
  const int64_t n = static_cast<int64_t>(costs.size());
  ASSERT_EQ(static_cast<int>(b.size()), parts + 1) << what;
  EXPECT_EQ(b.front(), 0) << what;
  EXPECT_EQ(b.back(), n) << what;
  double total = 0.0, largest = 0.0;
  for (const double c : costs) total += c, largest = std::max(largest, c);
  const bool unit = total <= 0.0;
  if (unit) total = static_cast<double>(n), largest = n > 0 ? 1.0 : 0.0;
  int64_t bad = 0;
  for (int k = 0; k < parts; ++k) {
    if (b[k + 1] < b[k]) ++bad;
    double part = 0.0;
    for (int64_t i = b[k]; i < b[k + 1]; ++i) part += unit ? 1.0 : costs[i];
    if (std::abs(part - total / parts) > largest + 1e-9) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " parts out of order or unbalanced";
}

TEST(GaussianSharding, BalancedBoundaries) {
  EXPECT_EQ(balanced_boundaries(torch::ones({4}, torch::kFloat64), 2),
            (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(balanced_boundaries(torch::tensor({5.0, 1.0, 1.0, 1.0}, torch::kFloat64), 2),
            (std::vector<int64_t>{0, 1, 4}));
  EXPECT_EQ(balanced_boundaries(torch::zeros({6}, torch::kFloat64), 3),
            (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(balanced_boundaries(torch::zeros({0}, torch::kFloat64), 3),
            (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_THROW(balanced_boundaries(torch::tensor({1.0, -1.0}, torch::kFloat64), 2), UserError);
  EXPECT_THROW(balanced_boundaries(torch::tensor({1.0, kNaN}, torch::kFloat64), 2), UserError);
  auto gen = generator(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = trial % 23 * 3;
    torch::Tensor c = torch::randint(0, 6, {n}, gen, torch::kInt64).to(torch::kFloat64);
    if (trial % 4 == 1 && n > 0) c[n / 2] = 40.0;  // one heavy entry
    if (trial % 4 == 2) c = c * 0.37;              // non-integer costs
    const std::vector<double> v(c.data_ptr<double>(), c.data_ptr<double>() + n);
    for (int parts = 1; parts <= 7; ++parts)
      check_balanced("trial " + std::to_string(trial) + " parts " + std::to_string(parts), v,
                     balanced_boundaries(c, parts), parts);
  }
}

// ---------------------------------------------------------------------------------------------
// Migration.

// Rank r's rows in the migration test: a pure function of (r, world size).
int64_t rows_of(int r) { return r % 2 == 0 ? 0 : 3 + 2 * r; }
torch::Tensor destinations_of(int r, int world, bool all_to_zero) {
  torch::Tensor i = torch::arange(rows_of(r), torch::kInt64);
  return all_to_zero ? torch::zeros_like(i) : (i * 5 + r * 3) % world;
}
std::vector<torch::Tensor> payload_of(int r) {
  const int64_t n = rows_of(r);
  const torch::Tensor id = torch::arange(n, torch::kInt64) + 1000 * r;
  return {id.to(torch::kFloat32).unsqueeze(1) * torch::tensor({1.0f, -0.5f, 0.25f}),  // [n, 3]
          id,                                                                        // [n]
          (id % 3 == 0),                                                             // [n] bool
          id.to(torch::kFloat64).reshape({n, 1, 1}).expand({n, 2, 2}).contiguous(),  // [n,2,2]
          torch::zeros({n, 0}, torch::kFloat64),                                     // [n, 0]
          (id % 7).to(torch::kInt16)};                                               // [n] int16
}

TEST(GaussianSharding, MigrateRowsOrderAndContent) {
  for (const bool all_to_zero : {false, true}) {
    std::vector<torch::Tensor> mine = payload_of(rank());
    mine[0].requires_grad_(true);
    const std::vector<torch::Tensor> got =
        migrate_rows(comm(), destinations_of(rank(), size(), all_to_zero), mine);
    ASSERT_EQ(got.size(), mine.size());
    // Expected: from each source in rank order, its rows bound here in their local order.
    std::vector<std::vector<torch::Tensor>> want(mine.size());
    for (int s = 0; s < size(); ++s) {
      const torch::Tensor keep =
          (destinations_of(s, size(), all_to_zero) == rank()).nonzero().select(1, 0);
      const std::vector<torch::Tensor> theirs = payload_of(s);
      for (size_t t = 0; t < theirs.size(); ++t) want[t].push_back(theirs[t].index_select(0, keep));
    }
    for (size_t t = 0; t < mine.size(); ++t) {
      const torch::Tensor w = torch::cat(want[t], 0);
      report("migrate tensor " + std::to_string(t) + (all_to_zero ? " to 0" : ""), got[t], w);
      EXPECT_EQ(got[t].scalar_type(), mine[t].scalar_type());
    }
    EXPECT_TRUE(got[0].requires_grad() && got[0].is_leaf());
  }
  EXPECT_THROW(migrate_rows(comm(), torch::zeros({2}, torch::kInt32), {}), UserError);
}

// ---------------------------------------------------------------------------------------------
// Rebalancing: a scene of G Gaussians whose every row is a pure function of its global id.

constexpr int64_t kSceneGaussians = 211;

SceneBounds scene_box() {
  SceneBounds b;
  for (int a = 0; a < 3; ++a) b.lo[a] = -2.0, b.hi[a] = 3.0;
  return b;
}

struct Scene {
  torch::Tensor means;                 // [G, 3] float32
  torch::Tensor costs;                 // [G] float64, integers 1..5
  std::vector<torch::Tensor> tensors;  // param, exp_avg, exp_avg_sq, flags, int32, half
};

Scene make_scene(int64_t g) {
  auto gen = generator(2024);
  Scene s;
  s.means = torch::rand({g, 3}, gen, torch::kFloat32) * 5.0f - 2.0f;
  // Every fifth Gaussian shares its position with the one before it (equal Morton codes: the tie
  // goes by global id), and a few lie outside the box (clamped).
  for (int64_t i = 5; i < g; i += 5) s.means[i] = s.means[i - 1];
  for (int64_t i = 3; i < g; i += 37) s.means[i][1] = 9.0f;
  const torch::Tensor id = torch::arange(g, torch::kInt64);
  s.costs = (id * 7 % 5 + 1).to(torch::kFloat64);
  const torch::Tensor param = id.to(torch::kFloat32).unsqueeze(1) * 10 + torch::arange(4);
  s.tensors = {param,                                                       // [G, 4] f32
               param * 0.5f,                                                // exp_avg
               id.to(torch::kFloat64).unsqueeze(1) + torch::arange(3) * 0.25,  // exp_avg_sq f64
               ((id.unsqueeze(1) + torch::arange(2)) % 3 == 0),             // [G, 2] bool
               (id * 7).to(torch::kInt32),                                  // [G] int32
               (id % 50).to(torch::kFloat16).reshape({g, 1, 1}).expand({g, 2, 3}).contiguous()};
  return s;
}

enum class Start { Blocks, RoundRobin, Reversed, AllOnLast };
const char* name(Start s) {
  switch (s) {
    case Start::Blocks: return "blocks";
    case Start::RoundRobin: return "round robin";
    case Start::Reversed: return "reversed";
    case Start::AllOnLast: return "all on last";
  }
  return "?";
}

// The global ids this rank starts with.
torch::Tensor initial_ids(Start start, int64_t g) {
  const torch::Tensor id = torch::arange(g, torch::kInt64);
  const int r = rank(), w = size();
  switch (start) {
    case Start::Blocks: {
      const std::vector<int64_t> b = balanced_boundaries(torch::ones({g}, torch::kFloat64), w);
      return id.narrow(0, b[r], b[r + 1] - b[r]);
    }
    case Start::RoundRobin: return id.index_select(0, (id % w == r).nonzero().select(1, 0));
    case Start::Reversed: {
      const torch::Tensor rev = id.flip(0);
      return rev.index_select(0, (rev % w == r).nonzero().select(1, 0));
    }
    case Start::AllOnLast: return r == w - 1 ? id : torch::zeros({0}, torch::kInt64);
  }
  return {};
}

ShardRows rows_for(const Scene& s, const torch::Tensor& ids, bool with_costs) {
  ShardRows rows;
  rows.means = s.means.index_select(0, ids);
  rows.global_ids = ids.clone();
  if (with_costs) rows.costs = s.costs.index_select(0, ids);
  for (const torch::Tensor& t : s.tensors) rows.tensors.push_back(t.index_select(0, ids));
  return rows;
}

// The single-process answer: ids in (morton, id) order and the ranks' ranges of it.
std::pair<torch::Tensor, std::vector<int64_t>> expected_split(const Scene& s, bool with_costs,
                                                              int parts) {
  const int64_t g = s.means.size(0);
  const torch::Tensor codes = morton_codes(s.means, scene_box());
  std::vector<std::pair<int64_t, int64_t>> keys(g);
  for (int64_t i = 0; i < g; ++i) keys[i] = {codes[i].item<int64_t>(), i};
  std::sort(keys.begin(), keys.end());
  std::vector<int64_t> order(g);
  for (int64_t i = 0; i < g; ++i) order[i] = keys[i].second;
  const torch::Tensor ids = torch::tensor(order, torch::kInt64);
  const torch::Tensor costs =
      with_costs ? s.costs.index_select(0, ids) : torch::ones({g}, torch::kFloat64);
  return {ids, balanced_boundaries(costs, parts)};
}

// An order-independent checksum of rows and ids: sum over rows of (id + 1) * sum(row).
double checksum(const torch::Tensor& ids, const torch::Tensor& rows) {
  if (ids.numel() == 0) return 0.0;
  const torch::Tensor r = rows.to(torch::kFloat64).reshape({rows.size(0), -1}).sum(1);
  return ((ids.to(torch::kFloat64) + 1) * r).sum().item<double>();
}

void check_rebalanced(const std::string& what, const Scene& s, const ShardRows& rows,
                      bool with_costs) {
  const int64_t g = s.means.size(0);
  const auto [order, b] = expected_split(s, with_costs, size());
  // This rank holds exactly its range of the global order, sorted.
  report(what + ": ids", rows.global_ids, order.narrow(0, b[rank()], b[rank() + 1] - b[rank()]));
  // Every row still belongs to its id (parameters and Adam state aligned).
  report(what + ": means", rows.means, s.means.index_select(0, rows.global_ids));
  if (with_costs) report(what + ": costs", rows.costs, s.costs.index_select(0, rows.global_ids));
  for (size_t t = 0; t < s.tensors.size(); ++t)
    report(what + ": tensor " + std::to_string(t), rows.tensors[t],
           s.tensors[t].index_select(0, rows.global_ids));
  // Global count and checksums over all ranks.
  std::vector<double> local = {static_cast<double>(rows.global_ids.numel()),
                               checksum(rows.global_ids, rows.means)};
  std::vector<double> want = {static_cast<double>(g),
                              checksum(torch::arange(g, torch::kInt64), s.means)};
  for (size_t t = 0; t < s.tensors.size(); ++t) {
    local.push_back(checksum(rows.global_ids, rows.tensors[t]));
    want.push_back(checksum(torch::arange(g, torch::kInt64), s.tensors[t]));
  }
  torch::Tensor sums = torch::tensor(local, torch::kFloat64);
  comm().allreduce(sums, distributed::ReduceOp::Sum);
  report(what + ": global count and checksums", sums, torch::tensor(want, torch::kFloat64), 1e-12);
  // Canonical order: identical to the scene whatever the world size and starting layout.
  const torch::Tensor all_ids = gather_canonical(comm(), rows.global_ids, rows.global_ids, -1);
  report(what + ": canonical ids", all_ids, torch::arange(g, torch::kInt64));
  for (size_t t = 0; t < s.tensors.size(); ++t) {
    const torch::Tensor c = gather_canonical(comm(), rows.global_ids, rows.tensors[t], 0);
    if (rank() == 0) {
      report(what + ": canonical tensor " + std::to_string(t), c, s.tensors[t]);
    } else {
      EXPECT_FALSE(c.defined());
    }
  }
}

TEST(GaussianSharding, RebalanceMatchesSingleProcessOrder) {
  const Scene s = make_scene(kSceneGaussians);
  for (const bool with_costs : {false, true}) {
    for (const Start start : {Start::Blocks, Start::RoundRobin, Start::Reversed, Start::AllOnLast}) {
      const std::string what = std::string(name(start)) + (with_costs ? ", costs" : ", unit cost");
      ShardRows rows = rows_for(s, initial_ids(start, kSceneGaussians), with_costs);
      RebalanceOptions o;
      o.force = true;
      const RebalanceReport rep = rebalance(comm(), rows, scene_box(), o);
      EXPECT_TRUE(rep.migrated) << what;
      EXPECT_EQ(rep.global_rows, kSceneGaussians);
      check_rebalanced(what, s, rows, with_costs);
      // Sorted by (morton, id) locally.
      const torch::Tensor codes = morton_codes(rows.means, scene_box());
      int64_t unsorted = 0;
      for (int64_t i = 1; i < codes.numel(); ++i) {
        const auto a = std::make_pair(codes[i - 1].item<int64_t>(), rows.global_ids[i - 1].item<int64_t>());
        const auto b = std::make_pair(codes[i].item<int64_t>(), rows.global_ids[i].item<int64_t>());
        unsorted += !(a < b);
      }
      EXPECT_EQ(unsorted, 0) << what << ": rows out of (morton, id) order";
      // Balance within one row (unit) or one cost unit's largest value (costs 1..5).
      torch::Tensor load = torch::tensor(
          {with_costs ? rows.costs.sum().item<double>() : static_cast<double>(rows.means.size(0))},
          torch::kFloat64);
      const double mean = (with_costs ? s.costs.sum().item<double>() : kSceneGaussians) / size();
      EXPECT_LE(std::abs(load.item<double>() - mean), with_costs ? 5.0 : 1.0) << what;
      // Rebalancing again changes nothing.
      ShardRows again = rows;
      rebalance(comm(), again, scene_box(), o);
      report(what + ": second rebalance", again.global_ids, rows.global_ids);
    }
  }
}

TEST(GaussianSharding, RebalanceTriggerAgreedAcrossRanks) {
  const Scene s = make_scene(kSceneGaussians);
  RebalanceOptions o;
  o.imbalance_threshold = 1.2;
  // Even blocks by count: no migration, rows untouched.
  ShardRows even = rows_for(s, initial_ids(Start::Blocks, kSceneGaussians), false);
  const torch::Tensor before = even.global_ids.clone();
  const RebalanceReport r1 = rebalance(comm(), even, scene_box(), o);
  EXPECT_FALSE(r1.migrated);
  EXPECT_LE(r1.count_imbalance, 1.2);
  report("untouched ids", even.global_ids, before);
  // Everything on one rank: imbalance = world size, migrates when more than one rank.
  ShardRows skewed = rows_for(s, initial_ids(Start::AllOnLast, kSceneGaussians), true);
  const RebalanceReport r2 = rebalance(comm(), skewed, scene_box(), o);
  EXPECT_NEAR(r2.count_imbalance, static_cast<double>(size()), 1e-12);
  EXPECT_EQ(r2.migrated, size() > 1);
  EXPECT_TRUE(all_ranks(r2.migrated) == r2.migrated && all_ranks(!r2.migrated) == !r2.migrated)
      << "ranks disagree on the decision";
  if (r2.migrated) check_rebalanced("triggered", s, skewed, true);
  torch::Tensor moved = torch::tensor({r2.rows_sent, r2.rows_received}, torch::kInt64);
  comm().allreduce(moved, distributed::ReduceOp::Sum);
  EXPECT_EQ(moved[0].item<int64_t>(), moved[1].item<int64_t>());
}

TEST(GaussianSharding, RebalanceTinyAndEmptyScenes) {
  for (const int64_t g : {int64_t{0}, int64_t{1}, int64_t{2}}) {
    const Scene s = make_scene(g);
    ShardRows rows = rows_for(s, initial_ids(Start::AllOnLast, g), false);
    RebalanceOptions o;
    o.force = true;
    const RebalanceReport rep = rebalance(comm(), rows, scene_box(), o);
    EXPECT_EQ(rep.global_rows, g);
    if (g > 0) check_rebalanced("tiny scene of " + std::to_string(g), s, rows, false);
    EXPECT_EQ(rows.means.size(0), rows.global_ids.size(0));
  }
}

TEST(GaussianSharding, GlobalBoundsAndCanonicalErrors) {
  const Scene s = make_scene(kSceneGaussians);
  const ShardRows rows = rows_for(s, initial_ids(Start::RoundRobin, kSceneGaussians), false);
  const SceneBounds b = global_bounds(comm(), rows.means);
  for (int a = 0; a < 3; ++a) {
    EXPECT_EQ(b.lo[a], s.means.select(1, a).min().item<double>());
    EXPECT_EQ(b.hi[a], s.means.select(1, a).max().item<double>());
  }
  // Duplicated ids are refused (every rank gives id 0 twice).
  EXPECT_THROW(gather_canonical(comm(), torch::zeros({2}, torch::kInt64), torch::zeros({2}), -1),
               UserError);
}

// ---------------------------------------------------------------------------------------------
// Image-space partition.

TEST(GaussianSharding, TilePartitionCoversEveryTileOnce) {
  auto gen = generator(5);
  for (const int64_t tiles : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{97}, int64_t{400}}) {
    torch::Tensor cost = torch::randint(0, 50, {tiles}, gen, torch::kInt64).to(torch::kFloat64);
    if (tiles > 10) cost.narrow(0, 0, tiles / 3).zero_();  // empty sky
    for (const int parts : {size(), 1, 5}) {
      const TilePartition p = partition_tiles(cost, parts);
      const std::string what = std::to_string(tiles) + " tiles, " + std::to_string(parts) + " parts";
      torch::Tensor covered = torch::zeros({tiles}, torch::kInt64);
      for (int r = 0; r < parts; ++r) covered += p.mask(r).to(torch::kInt64);
      report(what + ": coverage", covered, torch::ones({tiles}, torch::kInt64));
      torch::Tensor owner_from_masks = torch::zeros({tiles}, torch::kInt64);
      for (int r = 0; r < parts; ++r) owner_from_masks += p.mask(r).to(torch::kInt64) * r;
      report(what + ": owners", p.owners(), owner_from_masks);
      int64_t owner_wrong = 0;
      for (int64_t t = 0; t < tiles; ++t) owner_wrong += p.owner(t) != owner_from_masks[t].item<int64_t>();
      EXPECT_EQ(owner_wrong, 0) << what;
      check_balanced(what, std::vector<double>(cost.data_ptr<double>(), cost.data_ptr<double>() + tiles),
                     p.starts, parts);
      // The same on every rank.
      const torch::Tensor starts = torch::tensor(p.starts, torch::kInt64);
      const torch::Tensor all = comm().allgather(starts);
      report(what + ": same on all ranks", all, starts.unsqueeze(0).expand_as(all));
    }
  }
}

// The getRect rule written out again per Gaussian (kernels/gaussian_raster_math.h).
std::vector<int64_t> naive_rect(double mx, double my, int32_t radius, int64_t ts, int64_t tx,
                                int64_t ty) {
  if (radius <= 0 || !std::isfinite(mx) || !std::isfinite(my)) return {0, 0, 0, 0};
  auto clampt = [](double v, int64_t hi) {
    const double f = std::floor(v);
    return f <= 0 ? int64_t{0} : f >= hi ? hi : static_cast<int64_t>(f);
  };
  const double r = radius, t = static_cast<double>(ts);
  const int64_t x0 = clampt((mx - r) / t, tx), x1 = std::max(x0, clampt((mx + r + t - 1) / t, tx));
  const int64_t y0 = clampt((my - r) / t, ty), y1 = std::max(y0, clampt((my + r + t - 1) / t, ty));
  return {x0, x1, y0, y1};
}

// The exchange scene: V views of W x H pixels, G Gaussians owned by id % world (ascending id),
// each with a screen rect per view that is a pure function of (id, view).
constexpr int64_t kViews = 2, kWidth = 45, kHeight = 37, kTile = 8, kExGaussians = 60, kDim = 3;
constexpr int64_t kTilesX = (kWidth + kTile - 1) / kTile, kTilesY = (kHeight + kTile - 1) / kTile;
constexpr int64_t kTilesPerView = kTilesX * kTilesY;

struct Projected {
  torch::Tensor means2d;  // [G, 2] float32
  torch::Tensor radii;    // [G] int32
};
Projected projected(int64_t view) {
  auto gen = generator(100 + view);
  Projected p;
  p.means2d = torch::rand({kExGaussians, 2}, gen, torch::kFloat32) * 70.0f - 12.0f;
  p.radii = torch::randint(0, 14, {kExGaussians}, gen, torch::kInt64).to(torch::kInt32);
  p.radii[1] = 0;                     // culled
  p.means2d[2][0] = static_cast<float>(kNaN);              // non-finite centre: culled
  p.means2d[3] = torch::tensor({0.0f, 0.0f});  // corner
  return p;
}

TEST(GaussianSharding, TileRectsAndDestinationsMatchBruteForce) {
  const torch::Tensor cost = (torch::arange(kViews * kTilesPerView, torch::kInt64) * 7 % 5)
                                 .to(torch::kFloat64);
  for (const int parts : {size(), 3, 7}) {
    const TilePartition part = partition_tiles(cost, parts);
    const torch::Tensor owners = part.owners();
    for (int64_t v = 0; v < kViews; ++v) {
      const Projected p = projected(v);
      const torch::Tensor rects = tile_rects(p.means2d, p.radii, kWidth, kHeight, kTile);
      torch::Tensor want_rects = torch::empty({kExGaussians, 4}, torch::kInt64);
      torch::Tensor want_dest = torch::zeros({kExGaussians, parts}, torch::kBool);
      for (int64_t g = 0; g < kExGaussians; ++g) {
        const std::vector<int64_t> r =
            naive_rect(p.means2d[g][0].item<double>(), p.means2d[g][1].item<double>(),
                       p.radii[g].item<int32_t>(), kTile, kTilesX, kTilesY);
        want_rects[g] = torch::tensor(r, torch::kInt64);
        for (int64_t ty = r[2]; ty < r[3]; ++ty)
          for (int64_t tx = r[0]; tx < r[1]; ++tx)
            want_dest[g][owners[v * kTilesPerView + ty * kTilesX + tx].item<int64_t>()] = true;
      }
      report("rects view " + std::to_string(v), rects, want_rects);
      report("destinations view " + std::to_string(v) + " parts " + std::to_string(parts),
             destination_ranks(rects, kTilesX, v * kTilesPerView, part), want_dest);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The differentiable exchange.

// The ids this rank owns in the exchange test, and every Gaussian's parameter row (a pure function
// of its id; small dyadic values in float32 so that sums of the float32 loss's gradient are exact).
torch::Tensor owned_ids(int r, int w) {
  const torch::Tensor id = torch::arange(kExGaussians, torch::kInt64);
  return id.index_select(0, (id % w == r).nonzero().select(1, 0));
}
torch::Tensor param_rows(const torch::Tensor& ids, torch::ScalarType dtype) {
  return ((ids.unsqueeze(1) * 3 + torch::arange(kDim)) % 11 - 5).to(dtype) * 0.25;
}
// The projected row of a Gaussian in view v: differentiable in the parameters.
torch::Tensor project_rows(const torch::Tensor& params, int64_t v) { return params * (v + 1) + v; }

// A rendering-like loss of (row, tile) pairs: a fixed function of every pair (Gaussian, view, tile
// of its rect), so the total over ranks does not depend on how tiles are split.
torch::Tensor pair_loss(const torch::Tensor& rows,    // [K, D] the row of each pair
                        const torch::Tensor& tiles,   // [K] int64 batch tile index
                        bool smooth) {
  if (rows.size(0) == 0) return rows.sum();
  const torch::Tensor w = ((tiles.unsqueeze(1) + torch::arange(kDim)) % 3 + 1).to(rows.scalar_type());
  if (!smooth) return (0.5 * w * rows * rows).sum();  // integer-weighted squares: exact gradients
  return (torch::sin(rows * w * 0.3) + 0.1 * w * rows * rows * rows).sum();
}

// Pairs (row j, tile t) for rect rows whose tiles fall in [lo, hi): j repeated per tile.
std::pair<torch::Tensor, torch::Tensor> tile_pairs(const torch::Tensor& info,  // [R, 6] gid v x0 x1 y0 y1
                                                   int64_t lo, int64_t hi) {
  std::vector<int64_t> js, ts;
  for (int64_t j = 0; j < info.size(0); ++j) {
    const int64_t v = info[j][1].item<int64_t>();
    for (int64_t ty = info[j][4].item<int64_t>(); ty < info[j][5].item<int64_t>(); ++ty)
      for (int64_t tx = info[j][2].item<int64_t>(); tx < info[j][3].item<int64_t>(); ++tx) {
        const int64_t t = v * kTilesPerView + ty * kTilesX + tx;
        if (t >= lo && t < hi) js.push_back(j), ts.push_back(t);
      }
  }
  return {torch::tensor(js, torch::kInt64), torch::tensor(ts, torch::kInt64)};
}

// Rank r's projected rows, their side data (gid, view, rect) and destination mask, views stacked.
struct LocalBatch {
  torch::Tensor rows, info, destinations;
};
LocalBatch local_batch(int r, int w, const torch::Tensor& params, const TilePartition& part) {
  const torch::Tensor ids = owned_ids(r, w);
  std::vector<torch::Tensor> rows, info, dest;
  for (int64_t v = 0; v < kViews; ++v) {
    const Projected p = projected(v);
    const torch::Tensor rects = tile_rects(p.means2d.index_select(0, ids),
                                           p.radii.index_select(0, ids), kWidth, kHeight, kTile);
    rows.push_back(project_rows(params, v));
    info.push_back(torch::cat({ids.unsqueeze(1), torch::full({ids.size(0), 1}, v, torch::kInt64),
                               rects}, 1));
    dest.push_back(destination_ranks(rects, kTilesX, v * kTilesPerView, part));
  }
  return {torch::cat(rows, 0), torch::cat(info, 0), torch::cat(dest, 0)};
}

TEST(GaussianSharding, ExchangeForwardAndBackwardMatchOneProcess) {
  const torch::Tensor cost = (torch::arange(kViews * kTilesPerView, torch::kInt64) * 13 % 7)
                                 .to(torch::kFloat64);
  const TilePartition part = partition_tiles(cost, size());
  const torch::Tensor all_ids = torch::arange(kExGaussians, torch::kInt64);
  for (const bool smooth : {false, true}) {
    const auto dtype = smooth ? torch::kFloat64 : torch::kFloat32;
    const std::string what = smooth ? "float64 smooth loss" : "float32 exact loss";
    // Distributed: own, project, plan, exchange, render-like loss on this rank's block, backward.
    const torch::Tensor ids = owned_ids(rank(), size());
    const torch::Tensor params = param_rows(ids, dtype).requires_grad_(true);
    const LocalBatch mine = local_batch(rank(), size(), params, part);
    const ExchangePlan plan = make_exchange_plan(comm(), mine.destinations);
    const torch::Tensor received = exchange_projected(comm(), plan, mine.rows);
    const torch::Tensor info = exchange_with_plan(comm(), plan, mine.info);

    // Forward: exactly the rows bound here, from each source in its plan order.
    std::vector<torch::Tensor> want_info, want_rows;
    for (int s = 0; s < size(); ++s) {
      const LocalBatch theirs = local_batch(s, size(), param_rows(owned_ids(s, size()), dtype), part);
      const torch::Tensor keep = theirs.destinations.select(1, rank()).nonzero().select(1, 0);
      want_info.push_back(theirs.info.index_select(0, keep));
      want_rows.push_back(theirs.rows.index_select(0, keep));
    }
    report(what + ": received side data", info, torch::cat(want_info, 0));
    report(what + ": received rows", received, torch::cat(want_rows, 0));
    report(what + ": received_from", received_from(plan),
           torch::repeat_interleave(torch::arange(size()),
                                    torch::tensor(plan.recv_counts, torch::kInt64)));

    const auto [js, ts] = tile_pairs(info, part.begin(rank()), part.end(rank()));
    const torch::Tensor loss =
        pair_loss(received.index_select(0, js), ts, smooth) + 0 * received.sum();
    loss.backward();

    // One process: every Gaussian, every view, every tile of its rect.
    const torch::Tensor ref_params = param_rows(all_ids, dtype).requires_grad_(true);
    std::vector<torch::Tensor> ref_rows, ref_info;
    for (int64_t v = 0; v < kViews; ++v) {
      const Projected p = projected(v);
      ref_rows.push_back(project_rows(ref_params, v));
      ref_info.push_back(torch::cat({all_ids.unsqueeze(1),
                                     torch::full({kExGaussians, 1}, v, torch::kInt64),
                                     tile_rects(p.means2d, p.radii, kWidth, kHeight, kTile)}, 1));
    }
    const torch::Tensor rr = torch::cat(ref_rows, 0);
    const auto [rj, rt] = tile_pairs(torch::cat(ref_info, 0), 0, kViews * kTilesPerView);
    pair_loss(rr.index_select(0, rj), rt, smooth).backward();
    const torch::Tensor want_grad = ref_params.grad().index_select(0, ids);
    report(what + ": owner gradients", params.grad(), want_grad, 1e-6, 0.0);
    // The total loss over ranks is the one-process loss.
    torch::Tensor total = loss.detach().to(torch::kFloat64).reshape({1});
    comm().allreduce(total, distributed::ReduceOp::Sum);
    const double ref_loss = pair_loss(rr.index_select(0, rj), rt, smooth).item<double>();
    EXPECT_NEAR(total.item<double>(), ref_loss, 1e-6 * std::abs(ref_loss)) << what;

    // The raw op plus accumulate_to_sources gives the same row gradients as exchange_projected.
    const torch::Tensor rows_leaf = mine.rows.detach().requires_grad_(true);
    const torch::Tensor via_op = exchange_projected(comm(), plan, rows_leaf);
    (pair_loss(via_op.index_select(0, js), ts, smooth) + 0 * via_op.sum()).backward();
    const torch::Tensor sent = mine.rows.detach().index_select(0, plan.source_rows).requires_grad_(true);
    const torch::Tensor via_raw = all_to_all_rows(comm(), sent, plan.send_counts);
    (pair_loss(via_raw.index_select(0, js), ts, smooth) + 0 * via_raw.sum()).backward();
    report(what + ": accumulate_to_sources",
           accumulate_to_sources(sent.grad(), plan.source_rows, plan.num_rows), rows_leaf.grad());
  }
}

}  // namespace
}  // namespace tessera::models::gaussians
