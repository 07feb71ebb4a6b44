// The per-element math of kernels/fixed_point.h, shared by the CPU and the CUDA implementation.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace tessera::kernels::fixed_point {

constexpr int kLimbBits = 40;
constexpr int64_t kLimbMask = (int64_t{1} << kLimbBits) - 1;
constexpr int kFractionBits = 96;  // the value of limb 0's lowest bit is 2^-96

TESSERA_HD inline uint32_t float_bits(float v) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(v);
#else
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
#endif
}

// v's digits: v (rounded to a multiple of 2^-96) = (hi * 2^40 + lo) * 2^(40 limb - 96), both
// digits signed as v. Returns false for a value that cannot be held (not finite, or
// |v| >= 2^47); zero and values below 2^-97 give zero digits.
TESSERA_HD inline bool digits(float v, int& limb, int64_t& lo, int64_t& hi) {
  limb = 0;
  lo = hi = 0;
  const uint32_t bits = float_bits(v);
  const int exponent = static_cast<int>((bits >> 23) & 0xFFu);
  if (exponent == 0xFF) return false;  // inf, NaN
  if (exponent == 0) return true;      // zero or subnormal (< 2^-126): 0 at 2^-96
  // v = m * 2^(exponent - 150) with the implicit bit; its lowest bit sits at bit p of the sum.
  uint64_t m = (bits & 0x7FFFFFu) | 0x800000u;
  int p = exponent - 150 + kFractionBits;
  if (p < 0) {  // below 2^-96: rounded to the nearest multiple (ties away from zero)
    if (p < -25) return true;
    m = (m + (uint64_t{1} << (-p - 1))) >> -p;
    p = 0;
  }
  if (p >= 3 * kLimbBits) return false;  // |v| >= 2^47: the high digit would land past limb 3
  limb = p / kLimbBits;
  const uint64_t shifted = m << (p % kLimbBits);  // < 2^63: 24 bits shifted by at most 39
  lo = static_cast<int64_t>(shifted & static_cast<uint64_t>(kLimbMask));
  hi = static_cast<int64_t>(shifted >> kLimbBits);
  if (bits >> 31) {
    lo = -lo;
    hi = -hi;
  }
  return true;
}

// Adds v's digits to limbs[0..3]. Returns false (and adds nothing) for a value that cannot be
// held.
TESSERA_HD inline bool add(float v, int64_t* limbs) {
  int limb;
  int64_t lo, hi;
  if (!digits(v, limb, lo, hi)) return false;
  limbs[limb] += lo;
  limbs[limb + 1] += hi;
  return true;
}

#ifdef __CUDACC__
// Adds v to the fixed-point row `limbs` [4] with integer atomics (exact, so the order in which
// threads' adds land cannot change the sum); counts a value that cannot be held in *bad.
// Two's complement: a negative digit added as an unsigned wraps to the signed sum.
__device__ inline void atomic_add(float v, unsigned long long* limbs, unsigned long long* bad) {
  int limb;
  int64_t lo, hi;
  if (!digits(v, limb, lo, hi)) {
    atomicAdd(bad, 1ull);
    return;
  }
  if (lo != 0) atomicAdd(limbs + limb, static_cast<unsigned long long>(lo));
  if (hi != 0) atomicAdd(limbs + limb + 1, static_cast<unsigned long long>(hi));
}
#endif

// Limbs 0..2 into [0, 2^40), the carries into limb 3.
TESSERA_HD inline void normalize(int64_t* limbs) {
  int64_t carry = 0;
  for (int i = 0; i < 3; ++i) {
    const int64_t x = limbs[i] + carry;
    const int64_t digit = x & kLimbMask;  // x mod 2^40, also for negative x
    carry = (x - digit) >> kLimbBits;     // exact: x - digit is a multiple of 2^40
    limbs[i] = digit;
  }
  limbs[3] += carry;
}

// The value as a double: normalized digits of |value| summed from the top (each digit is exact
// in a double), then the sign. A pure function of the exact value.
TESSERA_HD inline double to_double(const int64_t* in) {
  int64_t l[4] = {in[0], in[1], in[2], in[3]};
  normalize(l);
  const bool negative = l[3] < 0;
  if (negative) {
    for (int i = 0; i < 4; ++i) l[i] = -l[i];
    normalize(l);
  }
  const double r = ((static_cast<double>(l[3]) * 0x1p120 + static_cast<double>(l[2]) * 0x1p80) +
                    static_cast<double>(l[1]) * 0x1p40) +
                   static_cast<double>(l[0]);
  const double v = r * 0x1p-96;
  return negative ? -v : v;
}

}  // namespace tessera::kernels::fixed_point
