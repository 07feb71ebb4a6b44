// The even split of N items over `parts` (ranks, micro-batches): part p gets [p N / parts,
// (p + 1) N / parts), sizes differing by at most one, the same split on every rank.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <utility>

namespace tessera {

inline std::pair<int64_t, int64_t> even_slice(int64_t n, int64_t part, int64_t parts) {
  if (parts < 1 || part < 0 || part >= parts)
    throw std::invalid_argument("even_slice: need 0 <= part < parts");
  return {n * part / parts, n * (part + 1) / parts};
}

}  // namespace tessera
