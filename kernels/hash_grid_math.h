// Math shared by the CPU and CUDA hash_encoding: which cell of a level a point falls in, the rows
// of its 8 vertices and their trilinear weights, in float32 rounded once per operation
// (hd_mul_rn, kernels/host_device.h), so that both implementations pick the same cells and the CPU tests cover the
// arithmetic the GPU runs. The callers own the loops (CPU: level-outer blocks of points and a
// level per backward task; CUDA: a thread per (point, level) and atomicAdd).
#pragma once

#include <cstdint>

#include "kernels/hash_encoding.h"
#include "kernels/host_device.h"

namespace tessera::kernels::hash_grid {

// The cell of one point on one level: the corner vertex and the fractions along each axis.
struct Cell {
  uint32_t x, y, z;  // lower corner, each in [0, N_l - 1]
  float fx, fy, fz;  // in [0, 1]
};

// Clamps to [0, 1] (NaN fails v > 0 and becomes 0, as fmax / fmin would make it) with
// comparisons rather than fmin / fmax, which GCC leaves as library calls (4% of a nerf-hash
// training step on the CPU).
TESSERA_HD inline float clamp_unit(float v) { return v > 0.0f ? (v < 1.0f ? v : 1.0f) : 0.0f; }

// Scales by N_l in float32 and keeps x = 1 in the last cell with fraction 1.
TESSERA_HD inline void cell_axis(float unit, float resolution, uint32_t& corner, float& frac) {
  const float pos = hd_mul_rn(clamp_unit(unit), resolution);
  // pos is in [0, N_l] with N_l <= 2^24: truncation is floor, exactly, without a library call.
  const float floor_pos = static_cast<float>(static_cast<int32_t>(pos));
  const float lower = floor_pos < resolution - 1.0f ? floor_pos : resolution - 1.0f;
  corner = static_cast<uint32_t>(lower);
  frac = pos - lower;
}

TESSERA_HD inline Cell cell_of(const float* p, float resolution) {
  Cell c;
  cell_axis(p[0], resolution, c.x, c.fx);
  cell_axis(p[1], resolution, c.y, c.fy);
  cell_axis(p[2], resolution, c.z, c.fz);
  return c;
}

// The row of vertex (x, y, z); see HashGridLevel. stride = N_l + 1.
TESSERA_HD inline uint32_t row_of(uint32_t x, uint32_t y, uint32_t z, uint32_t stride, bool dense,
                                  uint32_t mask) {
  if (dense) return x + y * stride + z * stride * stride;
  return (x ^ (y * kHashPrimeY) ^ (z * kHashPrimeZ)) & mask;
}

// Vertex k of the cell: offset (k & 1, k >> 1 & 1, k >> 2 & 1), weight (wx * wy) * wz.
TESSERA_HD inline void vertex(const Cell& c, uint32_t k, uint32_t stride, bool dense,
                              uint32_t mask, uint32_t& row, float& w) {
  const uint32_t dx = k & 1, dy = (k >> 1) & 1, dz = (k >> 2) & 1;
  const float wx = dx ? c.fx : 1.0f - c.fx;
  const float wy = dy ? c.fy : 1.0f - c.fy;
  const float wz = dz ? c.fz : 1.0f - c.fz;
  w = hd_mul_rn(hd_mul_rn(wx, wy), wz);
  row = row_of(c.x + dx, c.y + dy, c.z + dz, stride, dense, mask);
}

}  // namespace tessera::kernels::hash_grid
