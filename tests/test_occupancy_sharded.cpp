// Multi-rank test of the NeRF occupancy grid update: each rank evaluates its slice of the cells
// and allgatherv assembles the grid, which must be bitwise identical everywhere and to a local run.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cmath>

#include "distributed/communicator.h"
#include "distributed/process_context.h"
#include "models/nerf/occupancy_grid.h"
#include "tests/mpi_test_env.h"

namespace {

using tessera::models::nerf::OccupancyGrid;
using tessera::models::nerf::OccupancyGridOptions;

// A deterministic pointwise density: a soft sphere plus a ripple, so values vary per cell.
torch::Tensor density(const torch::Tensor& p) {
  const auto r = p.norm(2, 1);
  return torch::relu(0.6 - r) * 5.0 + 0.002 * (1.0 + torch::sin(7.0 * p.select(1, 0)));
}

// Number of elements where a and b differ bitwise (as int32 bit patterns).
int64_t count_wrong(const torch::Tensor& a, const torch::Tensor& b) {
  return a.contiguous().view(torch::kInt32).ne(b.contiguous().view(torch::kInt32)).sum().item<int64_t>();
}

class OccupancySharded : public ::testing::TestWithParam<int64_t> {};

TEST_P(OccupancySharded, SlicedUpdateMatchesLocalAndAgreesAcrossRanks) {
  auto comm = tessera::distributed::make_communicator(*tessera::test::g_context, "mpi",
                                                      torch::Device(torch::kCPU));
  ASSERT_GE(comm->size(), 2);
  OccupancyGridOptions options;
  options.resolution = GetParam();  // 17^3 = 4913 cells split unevenly over 2 and 3 ranks
  options.chunk = 1000;             // several chunks per slice
  const std::array<double, 6> bounds{-1.0, -1.5, -0.5, 1.0, 0.5, 1.5};
  OccupancyGrid sharded(options, bounds, torch::kCPU), local(options, bounds, torch::kCPU);
  const uint64_t seed = 42;
  for (int64_t step : {15, 31, 47}) {
    sharded.update(density, seed, step, comm.get());
    local.update(density, seed, step, nullptr);
    EXPECT_EQ(count_wrong(sharded.values(), local.values()), 0) << "step " << step;
  }
  // Every rank holds the same grid: compare against rank 0's.
  auto reference = sharded.values().clone();
  comm->broadcast(reference, 0);
  EXPECT_EQ(count_wrong(sharded.values(), reference), 0) << "rank " << comm->rank();
  EXPECT_TRUE(sharded.bitfield().equal(local.bitfield()));
  // The grid is not trivial: some cells occupied, some empty.
  const int64_t occupied = sharded.bitfield().sum().item<int64_t>();
  EXPECT_GT(occupied, 0);
  EXPECT_LT(occupied, sharded.num_cells());
}

INSTANTIATE_TEST_SUITE_P(Resolutions, OccupancySharded, ::testing::Values(int64_t{17}, int64_t{8}));

}  // namespace
