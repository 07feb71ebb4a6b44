// CUDA hash_encoding_fwd / hash_encoding_bwd: one thread per (point, level), as in instant-ngp.
// Backward scatters into the table in fixed point with integer atomicAdd (kernels/fixed_point.h:
// each contribution rounded by itself, the sums exact), then reads the table back as float:
// the same bits from run to run, whatever order the atomics land in. The cell, row and weight
// math is kernels/hash_grid_math.h, shared with the CPU.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <type_traits>

#include <algorithm>

#include "kernels/fixed_point.h"
#include "kernels/fixed_point_math.h"
#include "kernels/hash_encoding.h"
#include "kernels/hash_grid_math.h"

namespace tessera::kernels::cuda {

namespace {

// Threads over points, blockIdx.y over levels: a warp reads 32 neighbouring points of one level,
// whose rows are close on coarse levels. 256 threads keep 8 warps per block resident.
constexpr int kThreadsPerBlock = 256;

// The level table, passed by value as one launch argument (kHashEncodingMaxLevels bounds it).
struct Levels {
  float resolution[kHashEncodingMaxLevels];  // N_l
  uint32_t stride[kHashEncodingMaxLevels];   // N_l + 1
  uint32_t dense_bits;                       // bit l set: level l indexes densely
  uint32_t mask;                             // T - 1
};

Levels device_levels(const std::vector<HashGridLevel>& levels, int64_t table_size) {
  Levels d{};
  for (size_t l = 0; l < levels.size(); ++l) {
    d.resolution[l] = static_cast<float>(levels[l].resolution);
    d.stride[l] = static_cast<uint32_t>(levels[l].resolution + 1);
    if (levels[l].dense) d.dense_bits |= 1u << l;
  }
  d.mask = static_cast<uint32_t>(table_size - 1);
  return d;
}

using hash_grid::Cell;
using hash_grid::cell_of;
using hash_grid::vertex;

// kF > 0: F known at compile time (1, 2, 4, 8), features kept in registers; kF == 0: runtime F.
template <int kF>
__global__ void hash_encoding_fwd_kernel(int64_t num_points, int64_t num_levels,
                                         int64_t table_size, int64_t features, Levels levels,
                                         const float* __restrict__ positions,   // [N, 3]
                                         const float* __restrict__ embeddings,  // [L, T, F]
                                         float* __restrict__ encoded) {         // [N, L * F]
  const int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t l = blockIdx.y;
  if (n >= num_points) return;
  const int64_t F = kF > 0 ? kF : features;
  const Cell c = cell_of(positions + 3 * n, levels.resolution[l]);
  const bool dense = (levels.dense_bits >> l) & 1u;
  const float* table = embeddings + l * table_size * F;
  float* out = encoded + (n * num_levels + l) * F;
  if constexpr (kF > 0) {
    float acc[kF] = {};
    for (uint32_t k = 0; k < 8; ++k) {
      uint32_t row;
      float w;
      vertex(c, k, levels.stride[l], dense, levels.mask, row, w);
      const float* e = table + static_cast<int64_t>(row) * kF;
#pragma unroll
      for (int f = 0; f < kF; ++f) acc[f] = __fadd_rn(acc[f], __fmul_rn(w, __ldg(e + f)));
    }
#pragma unroll
    for (int f = 0; f < kF; ++f) out[f] = acc[f];
  } else {
    for (int64_t f = 0; f < F; ++f) out[f] = 0.0f;
    for (uint32_t k = 0; k < 8; ++k) {
      uint32_t row;
      float w;
      vertex(c, k, levels.stride[l], dense, levels.mask, row, w);
      const float* e = table + static_cast<int64_t>(row) * F;
      for (int64_t f = 0; f < F; ++f) out[f] = __fadd_rn(out[f], __fmul_rn(w, __ldg(e + f)));
    }
  }
}

// v_limbs [L * T * F, 4] must be zeroed.
template <int kF>
__global__ void hash_encoding_bwd_kernel(int64_t num_points, int64_t num_levels,
                                         int64_t table_size, int64_t features, Levels levels,
                                         const float* __restrict__ positions,  // [N, 3]
                                         const float* __restrict__ v_encoded,  // [N, L * F]
                                         unsigned long long* __restrict__ v_limbs,
                                         unsigned long long* __restrict__ bad) {
  const int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t l = blockIdx.y;
  if (n >= num_points) return;
  const int64_t F = kF > 0 ? kF : features;
  const Cell c = cell_of(positions + 3 * n, levels.resolution[l]);
  const bool dense = (levels.dense_bits >> l) & 1u;
  unsigned long long* table = v_limbs + l * table_size * F * kFixedPointLimbs;
  const float* g = v_encoded + (n * num_levels + l) * F;
  for (uint32_t k = 0; k < 8; ++k) {
    uint32_t row;
    float w;
    vertex(c, k, levels.stride[l], dense, levels.mask, row, w);
    unsigned long long* v = table + static_cast<int64_t>(row) * F * kFixedPointLimbs;
    if constexpr (kF > 0) {
#pragma unroll
      for (int f = 0; f < kF; ++f)
        fixed_point::atomic_add(__fmul_rn(w, g[f]), v + f * kFixedPointLimbs, bad);
    } else {
      for (int64_t f = 0; f < F; ++f)
        fixed_point::atomic_add(__fmul_rn(w, g[f]), v + f * kFixedPointLimbs, bad);
    }
  }
}

dim3 grid_for(int64_t num_points, int64_t num_levels) {
  return dim3(static_cast<unsigned>((num_points + kThreadsPerBlock - 1) / kThreadsPerBlock),
              static_cast<unsigned>(num_levels));
}

// Launchers: the stream is explicit; nothing is launched for N == 0.
template <int kF>
void launch_fwd(const at::Tensor& positions, const at::Tensor& embeddings,
                const Levels& levels, const at::Tensor& encoded, cudaStream_t stream) {
  const int64_t num_points = positions.size(0);
  if (num_points == 0) return;
  const int64_t num_levels = embeddings.size(0);
  hash_encoding_fwd_kernel<kF><<<grid_for(num_points, num_levels), kThreadsPerBlock, 0, stream>>>(
      num_points, num_levels, embeddings.size(1), embeddings.size(2), levels,
      positions.data_ptr<float>(), embeddings.data_ptr<float>(), encoded.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Points [first, first + count) of the backward (a launch of at most 2^19 points stays within
// the limbs' headroom, kernels/fixed_point.h).
template <int kF>
void launch_bwd(const at::Tensor& positions, const Levels& levels, int64_t num_levels,
                int64_t table_size, int64_t features, const at::Tensor& v_encoded,
                at::Tensor& v_limbs, at::Tensor& bad, int64_t first, int64_t count,
                cudaStream_t stream) {
  if (count == 0) return;
  hash_encoding_bwd_kernel<kF><<<grid_for(count, num_levels), kThreadsPerBlock, 0, stream>>>(
      count, num_levels, table_size, features, levels, positions.data_ptr<float>() + 3 * first,
      v_encoded.data_ptr<float>() + first * num_levels * features,
      reinterpret_cast<unsigned long long*>(v_limbs.data_ptr<int64_t>()),
      reinterpret_cast<unsigned long long*>(bad.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename Body>
void dispatch_features(int64_t features, Body&& body) {
  switch (features) {
    case 1: body(std::integral_constant<int, 1>{}); break;
    case 2: body(std::integral_constant<int, 2>{}); break;
    case 4: body(std::integral_constant<int, 4>{}); break;
    case 8: body(std::integral_constant<int, 8>{}); break;
    default: body(std::integral_constant<int, 0>{}); break;
  }
}

}  // namespace

at::Tensor hash_encoding_fwd(const at::Tensor& positions, const at::Tensor& embeddings,
                                const std::vector<HashGridLevel>& levels) {
  const c10::cuda::CUDAGuard guard(positions.device());
  const at::Tensor pos = positions.contiguous(), table = embeddings.contiguous();
  const int64_t num_levels = table.size(0), features = table.size(2);
  at::Tensor encoded = at::empty({pos.size(0), num_levels * features}, table.options());
  const Levels device = device_levels(levels, table.size(1));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_features(features, [&](auto kF) {
    launch_fwd<decltype(kF)::value>(pos, table, device, encoded, stream);
  });
  return encoded;
}

at::Tensor hash_encoding_bwd(const at::Tensor& positions,
                                const std::vector<HashGridLevel>& levels, int64_t table_size,
                                int64_t features_per_level, const at::Tensor& v_encoded) {
  const c10::cuda::CUDAGuard guard(positions.device());
  const at::Tensor pos = positions.contiguous(), grad = v_encoded.contiguous();
  const int64_t num_levels = static_cast<int64_t>(levels.size());
  TORCH_CHECK(grad.dim() == 2 && grad.size(0) == pos.size(0) &&
                  grad.size(1) == num_levels * features_per_level,
              "hash_encoding_bwd: v_encoded must be [N, L * F] = [", pos.size(0), ", ",
              num_levels * features_per_level, "], got ", grad.sizes());
  const int64_t rows = num_levels * table_size * features_per_level;
  at::Tensor v_limbs = at::zeros({rows, kFixedPointLimbs}, grad.options().dtype(at::kLong));
  at::Tensor bad = at::zeros({1}, v_limbs.options());
  const Levels device = device_levels(levels, table_size);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // The limbs' headroom: a point adds to a row at most 8 times (its 8 vertices may hash to one
  // row), so 2^19 points add at most 2^22 times to any row between two normalizations.
  constexpr int64_t kPointsPerLaunch = int64_t{1} << 19;
  for (int64_t first = 0; first < pos.size(0); first += kPointsPerLaunch) {
    const int64_t count = std::min(kPointsPerLaunch, pos.size(0) - first);
    dispatch_features(features_per_level, [&](auto kF) {
      launch_bwd<decltype(kF)::value>(pos, device, num_levels, table_size, features_per_level,
                                      grad, v_limbs, bad, first, count, stream);
    });
    fixed_point_normalize(v_limbs);
  }
  // NaN when a contribution could not be held (not finite, or >= 2^47).
  return kernels::fixed_point_to_float(v_limbs, at::kFloat, bad)
      .view({num_levels, table_size, features_per_level})
      .detach();  // not a view: it may become the table's grad
}

}  // namespace tessera::kernels::cuda
