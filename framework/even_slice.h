// The even split of N items over `parts` (ranks, micro-batches): part p gets [p N / parts,
// (p + 1) N / parts), sizes differing by at most one, the same split on every rank; and the same
// in whole chunks, in blocks (chunk_slice) or round-robin (strided_chunks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

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

// The chunks of `chunk` items of N items (the last one shorter) dealt round-robin: part p gets
// chunks p, p + parts, p + 2 parts, ... as [first, last) ranges, in order. The chunks are
// chunk_slice's, independent of `parts`; where the cost of items drifts along the range (the
// rows of a photo: sky at the top, a table near the camera at the bottom), every part gets some
// of each stretch, where chunk_slice would give one part the dearest block.
inline std::vector<std::pair<int64_t, int64_t>> strided_chunks(int64_t n, int64_t chunk,
                                                               int64_t part, int64_t parts) {
  if (chunk < 1) throw std::invalid_argument("strided_chunks: need chunk >= 1");
  if (parts < 1 || part < 0 || part >= parts)
    throw std::invalid_argument("strided_chunks: need 0 <= part < parts");
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t first = part * chunk; first < n; first += parts * chunk)
    ranges.emplace_back(first, std::min(n, first + chunk));
  return ranges;
}

}  // namespace tessera
