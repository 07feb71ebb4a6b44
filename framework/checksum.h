// The Tessera checksum (tessera-mlh64-v1, docs/formats.md "Checksums"): of every snapshot
// dataset, and of the whole body of every Tessera HDF5 file (framework/data/file_seal.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera {

// The checksum's name, as files record it.
constexpr const char* kChecksumAlgorithm = "tessera-mlh64-v1";

// A sum over the bytes' 8-byte little-endian words, each times an odd key of its position, so any
// byte range can be hashed on its own and the partial sums added (mod 2^64) in any order.
// `offset` is the position of `bytes` in the whole.
uint64_t checksum_partial(const void* bytes, size_t size, uint64_t offset);
// The checksum of `total_bytes` bytes whose partial sums add up to `sum`.
uint64_t checksum_finish(uint64_t sum, uint64_t total_bytes);
uint64_t checksum(const void* bytes, size_t size);  // both in one

}  // namespace tessera
