// The NeRF occupancy grid (instant-ngp's density grid, single level): per-cell density values
// with an EMA, a threshold, and the binary grid ray_march skips empty space with (docs/nerf.md).
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>

#include "distributed/communicator.h"

namespace tessera::models::nerf {

struct OccupancyGridOptions {
  // Cells per axis. 64^3 cells over the demo box are ~2 px of the 128 px demo image: fine enough
  // to skip the empty space around an object, coarse enough that an update costs 262k points.
  int64_t resolution = 64;
  // instant-ngp's EMA: each update keeps max(decay * old, new), so a cell whose density vanished
  // is forgotten after a few dozen updates while a transiently low sample does not empty it.
  float decay = 0.95f;
  // instant-ngp's NERF_MIN_OPTICAL_THICKNESS: a cell is occupied when its value (optical thickness
  // of one marching step, sigma * step) exceeds min(threshold, mean of all values). The cap by the
  // mean keeps a grid of a still-faint early model from emptying out entirely.
  float threshold = 0.01f;
  // Points evaluated per call of the density function, bounding the update's peak memory.
  int64_t chunk = 65536;
};

// Values start at kUnvisited (< 0): such a cell counts as occupied and its first update takes the
// new value as is. So the grid starts fully occupied and is exact after the first update.
constexpr float kOccupancyUnvisited = -1.0f;

class OccupancyGrid {
 public:
  // Density callback: world positions [M, 3] float32 (on the grid's device) -> values [M].
  using DensityFn = std::function<torch::Tensor(const torch::Tensor&)>;

  OccupancyGrid(const OccupancyGridOptions& options, const std::array<double, 6>& bounds,
                torch::Device device);

  int64_t resolution() const { return options_.resolution; }
  int64_t num_cells() const { return options_.resolution * options_.resolution * options_.resolution; }
  // Cell c = (x * G + y) * G + z, i.e. values viewed as [G, G, G] is indexed [x][y][z].
  const torch::Tensor& values() const { return values_; }  // [G^3] float32
  torch::Tensor& mutable_values() { return values_; }      // for snapshot restore
  torch::Tensor aabb() const;                               // [6] float32 on the CPU
  // min(threshold, mean of visited values); +inf-free: 0 cells visited gives `threshold`.
  float current_threshold() const;
  // [G, G, G] uint8 on the grid's device: value > threshold, or unvisited.
  torch::Tensor bitfield() const;

  // One jittered world position per cell, a pure function of (seed, step): cell c's point is
  // lo + (cell + u_c) * cell_size with u ~ U[0,1)^3 from a generator seeded by
  // hash(seed, step, kOccupancy). [G^3, 3] float32 on the CPU.
  torch::Tensor sample_positions(uint64_t seed, int64_t step) const;

  // Evaluates `density` at sample_positions(seed, step) and folds it in:
  // v = new if unvisited, else max(decay * v, new). Without `comm` every cell is evaluated here.
  // With `comm` (collective: all ranks call it) rank r evaluates cells
  // [r*C/N, (r+1)*C/N) and allgatherv assembles the full update, so every rank ends with the
  // same grid, bitwise equal to the local update when `density` is a pointwise function.
  void update(const DensityFn& density, uint64_t seed, int64_t step,
              distributed::Communicator* comm = nullptr);

 private:
  torch::Tensor evaluate(const DensityFn& density, const torch::Tensor& positions) const;

  OccupancyGridOptions options_;
  std::array<double, 6> bounds_;
  torch::Device device_;
  torch::Tensor values_;  // [G^3] float32 on device_
};

}  // namespace tessera::models::nerf
