// The Tessera checksum (tessera-mlh64-v1, docs/formats.md "Checksums").
#include "framework/checksum.h"

#include <cstring>

namespace tessera {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the checksum reads 8-byte words as little-endian, as files store them");

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / phi: spreads consecutive indices
constexpr uint64_t kChecksumSeed = 0x7465737365726131ull;  // "tessera1": the empty checksum != 0

// A bijective 64-bit mixer (xor-shift-multiply); its output looks random in every bit.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// The odd multiplier of word j. Odd, so that changing any bits of one word always changes the sum.
inline uint64_t word_key(uint64_t j) { return mix64((j + 1) * kGolden) | 1u; }
}  // namespace

uint64_t checksum_partial(const void* bytes, size_t size, uint64_t offset) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  uint64_t sum = 0;
  size_t i = 0;
  // Leading bytes of a word that started before `offset` (the rest of it is someone else's).
  uint64_t partial = 0;
  while (i < size && (offset + i) % 8 != 0) {
    partial |= uint64_t{p[i]} << (8 * ((offset + i) % 8));
    ++i;
  }
  if (i > 0) sum += partial * word_key(offset / 8);
  // Whole words; four accumulators keep the multiplies independent.
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  uint64_t j = (offset + i) / 8;
  for (; i + 32 <= size; i += 32, j += 4) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    s0 += w[0] * word_key(j);
    s1 += w[1] * word_key(j + 1);
    s2 += w[2] * word_key(j + 2);
    s3 += w[3] * word_key(j + 3);
  }
  for (; i + 8 <= size; i += 8, ++j) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    s0 += w * word_key(j);
  }
  sum += s0 + s1 + s2 + s3;
  // Trailing bytes: the start of a word that continues past this range (or the zero-padded last).
  if (i < size) {
    partial = 0;
    for (size_t lane = 0; i < size; ++i, ++lane) partial |= uint64_t{p[i]} << (8 * lane);
    sum += partial * word_key(j);
  }
  return sum;
}

uint64_t checksum_finish(uint64_t sum, uint64_t total_bytes) {
  return mix64(sum ^ mix64(total_bytes * kGolden + kChecksumSeed));
}

uint64_t checksum(const void* bytes, size_t size) {
  return checksum_finish(checksum_partial(bytes, size, 0), size);
}

}  // namespace tessera
