// Exact, order-independent sums of float32 values in fixed point (docs/training_loop.md,
// "Bitwise at any world size"). A sum is held as 4 int64 limbs per element:
//
//   value = sum_i limb[i] * 2^(40 i - 96),   i = 0..3
//
// Each float32 is rounded once, by itself, to a multiple of 2^-96 (exact for |v| >= 2^-73;
// smaller values lose their low bits, below 2^-97 they are 0) and its digits are added to two
// limbs. Integer addition is associative, so the sum is the same whatever the order, the thread
// count, or the grouping of the additions across ranks: it depends on the multiset of values
// alone. Limbs carry 23 bits of headroom: up to 2^22 additions per element between two
// fixed_point_normalize calls. Values that are not finite or have |v| >= 2^47 cannot be held;
// they are counted instead, and a sum with any of them reads as NaN.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::kernels {

inline constexpr int64_t kFixedPointLimbs = 4;

// acc: int64 [n, 4], contiguous. values: float32, n elements (any shape, contiguous or not).
// bad: int64 [1] on acc's device; += the number of values that could not be held.
void fixed_point_add(at::Tensor& acc, const at::Tensor& values, at::Tensor& bad);
// Carries in place so that limbs 0..2 lie in [0, 2^40) and limb 3 holds the signed rest: the
// one representation of the value, whatever additions led to it.
void fixed_point_normalize(at::Tensor& acc);
// acc (normalized or not; it is not modified) -> float [n] of `dtype` (float32 or float64): the
// exact value summed limb by limb in float64 (so within an ulp or two of the nearest, not always
// the nearest), the same bits for the same exact value. With `bad` (the count fixed_point_add
// kept, on acc's device): all NaN when it is not 0, as a float sum with a non-finite or
// too-large value would be non-finite, so that a run's non-finite policy sees it. No host sync.
at::Tensor fixed_point_to_float(const at::Tensor& acc, at::ScalarType dtype,
                                const at::Tensor& bad = {});

namespace cpu {
void fixed_point_add(at::Tensor& acc, const at::Tensor& values, at::Tensor& bad);
void fixed_point_normalize(at::Tensor& acc);
at::Tensor fixed_point_to_float(const at::Tensor& acc, at::ScalarType dtype);
}  // namespace cpu
namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA).
void fixed_point_add(at::Tensor& acc, const at::Tensor& values, at::Tensor& bad);
void fixed_point_normalize(at::Tensor& acc);
at::Tensor fixed_point_to_float(const at::Tensor& acc, at::ScalarType dtype);
}  // namespace cuda

}  // namespace tessera::kernels
