// ExactSum: sums of float32 tensors that come out bitwise the same whatever the order of the
// additions, the thread count, and how they are split across ranks (docs/training_loop.md,
// "Bitwise at any world size"). Each tensor's elements are held in fixed point
// (kernels/fixed_point.h: 4 int64 limbs, resolution 2^-96, |value| < 2^47 per addend); the sum
// over ranks is an int64 allreduce, which integer addition makes exact.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "distributed/communicator.h"

namespace tessera {

class ExactSum {
 public:
  // One sum per tensor of `shapes`, each of that shape, held on `device`.
  ExactSum(const std::vector<std::vector<int64_t>>& shapes, torch::Device device);

  size_t size() const { return offsets_.size(); }
  void clear();
  // Adds `value` (float32, the shape of sum `index`; undefined adds nothing) to sum `index`.
  // Each call counts as one addition towards the limbs' headroom (2^22 between normalizations;
  // allreduce and value normalize).
  void add(size_t index, const torch::Tensor& value);
  // Every rank's sums summed, exactly, in one int64 allreduce. Collective.
  void allreduce(distributed::Communicator& comm);
  // Sum `index` as `dtype` (float32 or float64), in its shape: NaN everywhere when a value added
  // to it was not finite or too large to hold (so the run's non-finite policy sees it).
  torch::Tensor value(size_t index, torch::ScalarType dtype = torch::kFloat32);

 private:
  void count_addition();
  int64_t elements(size_t index) const;  // of sum `index`
  torch::Tensor bad_count(size_t index);  // int64 [1], a view of limbs_

  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_;  // first row of each sum in limbs_
  // int64 [elements of every sum + one row per sum, 4]: the digits, then each sum's count of
  // values not held (in limb 0), so that one allreduce carries both.
  torch::Tensor limbs_;
  int64_t rows_ = 0;              // total elements
  int64_t additions_ = 0;         // since the last normalization
};

}  // namespace tessera
