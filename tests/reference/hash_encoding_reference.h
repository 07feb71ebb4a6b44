// The plain-LibTorch hash encoding that tests/test_hash_encoding.cpp checks the op against and
// tests/bench/bench_hash_encoding.cpp times it against: what one writes without a custom op.
#pragma once

#include <torch/types.h>

#include <cmath>
#include <vector>

#include "kernels/hash_encoding.h"

namespace tessera::test {

// Per level: the cell's integer corner, the 8 vertex rows with int64 tensor ops (the hash
// products masked to 32 bits, as uint32 arithmetic wraps), trilinear weights, rows gathered with
// index_select and summed. The resolutions come from the header's documented formula, recomputed
// here, not from hash_grid_levels. Differentiable with respect to `embeddings`.
inline torch::Tensor reference_encoding(const torch::Tensor& positions,   // [N, 3]
                                        const torch::Tensor& embeddings,  // [L, T, F]
                                        const kernels::HashEncodingConfig& c) {
  constexpr int64_t kLow32 = 0xFFFFFFFFll;
  const int64_t table_size = int64_t{1} << c.log2_hashmap_size;
  const torch::Tensor unit = positions.clamp(0.0, 1.0);
  std::vector<torch::Tensor> per_level;
  for (int l = 0; l < c.levels; ++l) {
    const int64_t n = static_cast<int64_t>(
        std::floor(c.base_resolution * std::pow(c.per_level_scale, l) + 1e-6));
    const int64_t stride = n + 1;
    const bool dense = stride * stride * stride <= table_size;
    const torch::Tensor pos = unit * static_cast<float>(n);  // float32, [N, 3]
    const torch::Tensor lower = pos.floor().clamp_max(static_cast<double>(n - 1));
    const torch::Tensor frac = pos - lower;
    const torch::Tensor corner = lower.to(torch::kInt64);
    const torch::Tensor table = embeddings.select(0, l);
    torch::Tensor level;
    for (int k = 0; k < 8; ++k) {
      const int64_t d[3] = {k & 1, (k >> 1) & 1, (k >> 2) & 1};
      const torch::Tensor x = corner.select(1, 0) + d[0];
      const torch::Tensor y = corner.select(1, 1) + d[1];
      const torch::Tensor z = corner.select(1, 2) + d[2];
      const torch::Tensor row =
          dense ? x + y * stride + z * stride * stride
                : torch::bitwise_and(
                      torch::bitwise_xor(
                          torch::bitwise_xor(x, torch::bitwise_and(y * 2654435761ll, kLow32)),
                                         torch::bitwise_and(z * 805459861ll, kLow32)),
                      table_size - 1);
      const torch::Tensor w = (d[0] ? frac.select(1, 0) : 1 - frac.select(1, 0)) *
                              (d[1] ? frac.select(1, 1) : 1 - frac.select(1, 1)) *
                              (d[2] ? frac.select(1, 2) : 1 - frac.select(1, 2));
      const torch::Tensor term = w.unsqueeze(1) * table.index_select(0, row);
      level = level.defined() ? level + term : term;
    }
    per_level.push_back(level);
  }
  return torch::cat(per_level, 1);
}

}  // namespace tessera::test
