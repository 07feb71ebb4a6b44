// The seal of a Tessera HDF5 file (docs/formats.md, "The seal"): its first 512 bytes, HDF5's
// user block, which HDF5 itself skips, hold the checksum and size of everything after them.
// Writers seal a file once HDF5 has closed it; readers check the seal with plain reads before
// HDF5 parses a byte, so that a damaged or truncated file is refused by name instead of reaching
// HDF5's metadata code (which does not survive every kind of damage). The seal detects damage,
// not tampering: anyone can write a matching one.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::data::seal {

// Size of the block, and where HDF5's superblock starts.
constexpr uint64_t kBlockBytes = 512;

// Bytes after the block (the "body") in the file at `path`; throws std::runtime_error when the
// file cannot be read or is shorter than the block.
uint64_t body_bytes(const std::string& path);
// The checksum_partial sum of body bytes [begin, end) (offsets in the body), read in blocks of
// bounded size, so that ranks can each sum a slice of one file and add the sums.
uint64_t body_sum(const std::string& path, uint64_t begin, uint64_t end);
// Writes the seal of a body of `bytes` bytes whose partial sums add up to `sum`, over the block.
void write(const std::string& path, uint64_t sum, uint64_t bytes);
// body_sum over the whole body, then write: the one-process writers' whole job.
void seal(const std::string& path);

// Throws UserError "PATH: ..." unless `path` starts with a seal that its body matches: naming a
// missing file, a folder, a file too short or without a seal (a plain HDF5 file among them), a
// newer seal version, a truncated or extended file, and a checksum mismatch.
void verify(const std::string& path);

}  // namespace tessera::data::seal
