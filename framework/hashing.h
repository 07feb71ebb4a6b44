// Counter-based hashing shared by everything that draws "random" values as pure functions of
// their indices (ray sampling, the families' initialization and densification).
#pragma once

#include <cstdint>
#include <initializer_list>

namespace tessera {

// splitmix64's finalizer (Steele et al. 2014): a bijective 64-bit mix with full avalanche.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Chains splitmix64 over `values` from `start` (a per-user domain constant): a pure function of
// the whole list, order-sensitive.
inline uint64_t chain_hash(uint64_t start, std::initializer_list<uint64_t> values) {
  uint64_t h = start;
  for (uint64_t v : values) h = splitmix64(h ^ splitmix64(v));
  return h;
}

}  // namespace tessera
