// The even split of N items over `parts` (ranks, micro-batches): part p gets [p N / parts,
// (p + 1) N / parts), sizes differing by at most one, the same split on every rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>

namespace tessera {

inline std::pair<int64_t, int64_t> even_slice(int64_t n, int64_t part, int64_t parts) {
  if (parts < 1 || part < 0 || part >= parts)
    throw std::invalid_argument("even_slice: need 0 <= part < parts");
  return {n * part / parts, n * (part + 1) / parts};
}

// The even split of N items over `parts` in whole chunks of `chunk` items (the last chunk
// shorter): the chunks do not depend on `parts`, so each item lands in the same chunk, with the
// same neighbours, however many parts there are (run.deterministic: the same shapes on any
// rank). Part p gets the chunks even_slice(chunks, p, parts).
inline std::pair<int64_t, int64_t> chunk_slice(int64_t n, int64_t chunk, int64_t part,
                                               int64_t parts) {
  if (chunk < 1) throw std::invalid_argument("chunk_slice: need chunk >= 1");
  const auto [first, last] = even_slice((n + chunk - 1) / chunk, part, parts);
  return {std::min(n, first * chunk), std::min(n, last * chunk)};
}

}  // namespace tessera
