// hash_encoding: the multiresolution hash encoding of instant-ngp (Müller et al. 2022). Points in
// [0, 1]^3 are trilinearly interpolated in L grids of growing resolution, dense or hashed tables.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tessera::kernels {

// The spatial-hash primes of instant-ngp (after Teschner et al. 2003); x is multiplied by 1 so
// that neighbouring x stay coherent in the table. The arithmetic wraps in uint32.
constexpr uint32_t kHashPrimeY = 2654435761u;
constexpr uint32_t kHashPrimeZ = 805459861u;

// Bounds the per-level table the CUDA kernels take by value (one launch argument); instant-ngp
// configurations use 8 to 24 levels.
constexpr int kHashEncodingMaxLevels = 32;

// Float32 positions times the resolution must still tell cells apart: above 2^24 cells per axis
// neighbouring float32 values of x * N are more than one cell apart.
constexpr int64_t kHashEncodingMaxResolution = int64_t{1} << 24;

struct HashEncodingConfig {
  int levels = 16;              // L
  int features_per_level = 2;   // F
  int log2_hashmap_size = 19;   // T = 2^log2_hashmap_size rows per level
  int base_resolution = 16;     // N_min: cells per axis of level 0
  double per_level_scale = 2.0; // b; see hash_encoding_per_level_scale
};

// b = exp((ln N_max - ln N_min) / (L - 1)), the growth that takes level 0 at N_min cells per
// axis to level L - 1 at N_max. 1.0 when L == 1.
double hash_encoding_per_level_scale(int base_resolution, int finest_resolution, int levels);

// One level of the grid, as the implementations use it.
//   resolution N_l = floor(base_resolution * per_level_scale^l + kHashEncodingResolutionSlack),
//   in cells per axis (computed in double); the level has (N_l + 1)^3 vertices.
//   dense: (N_l + 1)^3 <= T; the vertex (x, y, z) is row x + y (N_l + 1) + z (N_l + 1)^2, and
//   rows past (N_l + 1)^3 stay unused (coarse levels waste part of their table, as a single
//   [L, T, F] tensor is simpler to optimize and to shard than ragged per-level tables).
//   hashed otherwise: row (x ^ (y * kHashPrimeY) ^ (z * kHashPrimeZ)) & (T - 1), in uint32.
// This is the "N_l cells" convention (vertices at multiples of 1 / N_l, x = 0 and x = 1 on
// vertices), not instant-ngp's (N_min b^l - 1 scale, half-cell offset, ceil + 1 resolution).
struct HashGridLevel {
  int64_t resolution;  // N_l
  bool dense;
};

// The slack added before the floor: b from hash_encoding_per_level_scale goes through exp and log,
// so base * b^l can land an ulp below the integer it stands for (16 * 2^3 as 127.99999999).
constexpr double kHashEncodingResolutionSlack = 1e-6;

// The levels of `config`, validated (levels in [1, kHashEncodingMaxLevels], F >= 1,
// log2_hashmap_size in [1, 30], base_resolution >= 1, per_level_scale finite and >= 1, every
// N_l <= kHashEncodingMaxResolution); throws c10::Error naming the bad field otherwise.
std::vector<HashGridLevel> hash_grid_levels(const HashEncodingConfig& config);

// The differentiable op. Dispatches to the CPU or the CUDA implementation by the inputs' device.
//   positions: float32 [N, 3], any strides. The caller normalizes by the scene box; coordinates
//   outside [0, 1] are clamped to it (NaN counts as 0). Positions get no gradient: passing them
//   with requires_grad (in grad mode) is an error.
//   embeddings: float32 [L, T, F] on the device of positions, with L, T, F from config.
// Returns float32 [N, L * F], level-major: columns l * F .. l * F + F - 1 are level l's features,
// the trilinear interpolation of the 8 vertices of the point's cell. At x = 1 the point lies in
// the last cell (N_l - 1) with fraction 1.
at::Tensor hash_encoding(const at::Tensor& positions,   // [N, 3]
                            const at::Tensor& embeddings,  // [L, T, F]
                            const HashEncodingConfig& config);

// The two implementations take the same arguments and return the same tensors. They expect
// inputs validated by hash_encoding (float32, shapes, one device) and accept any strides.
// `levels` is hash_grid_levels(config). Backward returns v_embeddings [L, T, F]: for every point,
// level and vertex, weight * v_encoded scattered into the vertex's row (rows no point touches are
// 0).
//   CPU: forward parallel over points; backward parallel over levels (each level owns a disjoint
//   slice of the table) and serial over points within a level, so every row is summed in point
//   order: v_embeddings is bitwise the same for any thread count.
//   CUDA: one thread per (point, level); backward adds each contribution into the row in fixed
//   point with integer atomicAdd (kernels/fixed_point.h), exact whatever the order the atomics
//   land in, then reads the table back as float: bitwise the same from run to run (not the CPU's
//   bits: the CPU sums in float, in point order). A contribution that is not finite or of 2^47
//   or more makes the whole gradient NaN.
namespace cpu {
at::Tensor hash_encoding_fwd(
    // forward inputs
    const at::Tensor& positions,   // [N, 3]
    const at::Tensor& embeddings,  // [L, T, F]
    const std::vector<HashGridLevel>& levels);

at::Tensor hash_encoding_bwd(
    // forward inputs
    const at::Tensor& positions,   // [N, 3]
    const std::vector<HashGridLevel>& levels, int64_t table_size, int64_t features_per_level,
    // grad outputs
    const at::Tensor& v_encoded);  // [N, L * F]
}  // namespace cpu

namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA). The current stream.
at::Tensor hash_encoding_fwd(
    // forward inputs
    const at::Tensor& positions,   // [N, 3]
    const at::Tensor& embeddings,  // [L, T, F]
    const std::vector<HashGridLevel>& levels);

at::Tensor hash_encoding_bwd(
    // forward inputs
    const at::Tensor& positions,   // [N, 3]
    const std::vector<HashGridLevel>& levels, int64_t table_size, int64_t features_per_level,
    // grad outputs
    const at::Tensor& v_encoded);  // [N, L * F]
}  // namespace cuda

}  // namespace tessera::kernels
