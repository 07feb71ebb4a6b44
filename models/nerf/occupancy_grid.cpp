// The NeRF occupancy grid: jittered density probes, EMA, threshold, and the sharded update.
#include "models/nerf/occupancy_grid.h"

#include <algorithm>
#include <stdexcept>

#include "framework/even_slice.h"
#include "models/nerf/nerf_common.h"

namespace tessera::models::nerf {

OccupancyGrid::OccupancyGrid(const OccupancyGridOptions& options,
                             const std::array<double, 6>& bounds, torch::Device device)
    : options_(options), bounds_(bounds), device_(device) {
  if (options_.resolution < 1) throw std::invalid_argument("occupancy grid resolution must be >= 1");
  values_ = torch::full({num_cells()}, kOccupancyUnvisited,
                        torch::TensorOptions().dtype(torch::kFloat32).device(device_));
}

torch::Tensor OccupancyGrid::aabb() const {
  auto box = torch::empty({6}, torch::kFloat32);
  for (int i = 0; i < 6; ++i) box[i] = static_cast<float>(bounds_[i]);
  return box;
}

float OccupancyGrid::current_threshold() const {
  const auto visited = values_.ge(0);
  const int64_t count = visited.sum().item<int64_t>();
  if (count == 0) return options_.threshold;
  // The mean over visited cells from an integer sum of the values in fixed point (2^-16, values
  // capped at 2^20; 256^3 cells stay below 2^60): exact, so the same at any thread count, where
  // a float sum is not.
  const double fixed = values_.clamp(0, 1 << 20).mul(65536.0).round().to(torch::kInt64)
                           .sum().item<int64_t>();
  const float mean = static_cast<float>(fixed / 65536.0 / static_cast<double>(count));
  return std::min(options_.threshold, mean);
}

torch::Tensor OccupancyGrid::bitfield() const {
  const int64_t g = options_.resolution;
  const auto occupied = values_.gt(current_threshold()).logical_or(values_.lt(0));
  return occupied.to(torch::kUInt8).view({g, g, g});
}

torch::Tensor OccupancyGrid::sample_positions(uint64_t seed, int64_t step) const {
  const int64_t g = options_.resolution;
  auto generator =
      make_generator({seed, static_cast<uint64_t>(step), static_cast<uint64_t>(RandomPurpose::kOccupancy)});
  const auto u = torch::rand({num_cells(), 3}, generator, torch::TensorOptions().dtype(torch::kFloat32));
  const auto idx = torch::arange(num_cells(), torch::kInt64);
  const auto cell =
      torch::stack({idx.div(g * g, "floor"), idx.div(g, "floor").remainder(g), idx.remainder(g)}, 1)
          .to(torch::kFloat32);
  auto lo = torch::empty({1, 3}, torch::kFloat32), size = torch::empty({1, 3}, torch::kFloat32);
  for (int a = 0; a < 3; ++a) {
    lo[0][a] = static_cast<float>(bounds_[a]);
    size[0][a] = static_cast<float>((bounds_[a + 3] - bounds_[a]) / static_cast<double>(g));
  }
  return lo + (cell + u) * size;
}

torch::Tensor OccupancyGrid::evaluate(const DensityFn& density, const torch::Tensor& positions) const {
  torch::NoGradGuard no_grad;
  const int64_t n = positions.size(0);
  auto out = torch::empty({n}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  for (int64_t begin = 0; begin < n; begin += options_.chunk) {
    const int64_t end = std::min(n, begin + options_.chunk);
    const auto v = density(positions.slice(0, begin, end).to(device_)).reshape({-1});
    if (v.size(0) != end - begin) throw std::runtime_error("occupancy density callback: wrong size");
    out.slice(0, begin, end).copy_(v);
  }
  return out;
}

void OccupancyGrid::update(const DensityFn& density, uint64_t seed, int64_t step,
                           distributed::Communicator* comm) {
  const auto positions = sample_positions(seed, step);
  torch::Tensor fresh;
  if (comm == nullptr || comm->size() == 1) {
    fresh = evaluate(density, positions);
  } else {
    // Whole chunks per rank (the chunks of the one-rank update): each cell is evaluated in the
    // same chunk, with the same shapes, at any world size.
    const int64_t c = num_cells();
    const auto [begin, end] = chunk_slice(c, options_.chunk, comm->rank(), comm->size());
    const auto mine = evaluate(density, positions.slice(0, begin, end));
    fresh = comm->allgatherv(mine.to(comm->device())).to(device_);
    if (fresh.size(0) != c) throw std::runtime_error("occupancy grid: allgatherv size mismatch");
  }
  const auto decayed = torch::maximum(values_ * options_.decay, fresh);
  values_.copy_(torch::where(values_.lt(0), fresh, decayed));
}

}  // namespace tessera::models::nerf
