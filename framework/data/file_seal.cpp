// The seal of a Tessera HDF5 file: a text block of 512 bytes, zero-padded,
//
//   tessera-seal 1
//   algorithm tessera-mlh64-v1
//   body-bytes 123456
//   checksum 0123456789abcdef
//
// checked byte for byte, so that anything else in the block is damage too.
#include "framework/data/file_seal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <spdlog/spdlog.h>

#include "distributed/errors.h"
#include "framework/checksum.h"

namespace tessera::data::seal {

namespace {

constexpr const char* kMagic = "tessera-seal ";
constexpr int kSealVersion = 1;
constexpr uint64_t kReadBytes = uint64_t{4} << 20;
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

std::string os_error() { return std::strerror(errno); }

// A file descriptor that closes itself.
struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(Fd&& other) noexcept : fd(other.fd) { other.fd = -1; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Fd open_or_throw(const std::string& path, int flags) {
  Fd file;
  file.fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (file.fd < 0) throw std::runtime_error(path + ": cannot open (" + os_error() + ")");
  return file;
}

uint64_t size_of(const Fd& file, const std::string& path) {
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) throw std::runtime_error(path + ": " + os_error());
  return static_cast<uint64_t>(info.st_size);
}

// Reads exactly `size` bytes at `offset`; false at an early end of file.
bool read_at(const Fd& file, const std::string& path, void* out, uint64_t size, uint64_t offset) {
  auto* bytes = static_cast<unsigned char*>(out);
  while (size > 0) {
    const ssize_t got = ::pread(file.fd, bytes, size, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw std::runtime_error(path + ": cannot read (" + os_error() + ")");
    if (got == 0) return false;
    bytes += got;
    size -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

uint64_t sum_range(const Fd& file, const std::string& path, uint64_t begin, uint64_t end) {
  std::vector<unsigned char> buffer(static_cast<size_t>(std::min(kReadBytes, end - begin)));
  uint64_t sum = 0;
  for (uint64_t at = begin; at < end;) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), end - at);
    if (!read_at(file, path, buffer.data(), n, kBlockBytes + at))
      throw std::runtime_error(path + ": ended while being read (is another process writing it?)");
    sum += checksum_partial(buffer.data(), static_cast<size_t>(n), at);
    at += n;
  }
  return sum;
}

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string seal_text(uint64_t checksum_value, uint64_t bytes) {
  return std::string(kMagic) + std::to_string(kSealVersion) + "\nalgorithm " + kChecksumAlgorithm +
         "\nbody-bytes " + std::to_string(bytes) + "\nchecksum " + hex(checksum_value) + "\n";
}

// What a block that is not a valid seal is, in words.
std::string unsealed_reason(const unsigned char* block) {
  if (std::memcmp(block, kHdf5Signature, sizeof(kHdf5Signature)) == 0)
    return "an HDF5 file without a Tessera seal (written by another program, or by a Tessera "
           "older than the sealed formats tessera-scene 2, tessera-shapes 2 and "
           "tessera-snapshot 2): Tessera reads only files it sealed, so that damage is found "
           "before HDF5 parses them; write it again with this Tessera (docs/formats.md, \"The "
           "seal\")";
  const size_t magic = std::strlen(kMagic);
  if (std::memcmp(block, kMagic, magic) != 0)
    return "not a Tessera file (it does not start with a Tessera seal; not HDF5, or damaged?)";
  const char* version = reinterpret_cast<const char*>(block) + magic;
  if (version[0] >= '1' && version[0] <= '9' && version[0] - '0' > kSealVersion &&
      version[1] == '\n')
    return "sealed by a newer Tessera (seal version " + std::string(1, version[0]) +
           ", this build reads version " + std::to_string(kSealVersion) +
           "); update Tessera (or the file is damaged)";
  return "its seal (the first " + std::to_string(kBlockBytes) + " bytes) is damaged";
}

// Parses the block; false when it is not exactly a seal of this version.
bool parse(const unsigned char* block, uint64_t& checksum_value, uint64_t& bytes) {
  const std::string text(reinterpret_cast<const char*>(block), kBlockBytes);
  const std::string head = std::string(kMagic) + std::to_string(kSealVersion) + "\nalgorithm " +
                           kChecksumAlgorithm + "\nbody-bytes ";
  if (text.compare(0, head.size(), head) != 0) return false;
  size_t at = head.size();
  const size_t digits_end = text.find('\n', at);
  if (digits_end == std::string::npos || digits_end == at || digits_end - at > 19) return false;
  bytes = 0;
  for (; at < digits_end; ++at) {
    if (text[at] < '0' || text[at] > '9') return false;
    bytes = bytes * 10 + static_cast<uint64_t>(text[at] - '0');
  }
  const std::string key = "\nchecksum ";
  if (text.compare(at, key.size(), key) != 0) return false;
  at += key.size();
  checksum_value = 0;
  for (size_t end = at + 16; at < end; ++at) {
    const char c = text[at];
    int digit = 0;
    if (c >= '0' && c <= '9') digit = c - '0';
    else if (c >= 'a' && c <= 'f') digit = 10 + c - 'a';
    else return false;
    checksum_value = checksum_value << 4 | static_cast<uint64_t>(digit);
  }
  if (text[at++] != '\n') return false;
  // The written text again: the parse accepted nothing it would not write (no leading zeros).
  if (text.compare(0, at, seal_text(checksum_value, bytes)) != 0) return false;
  for (; at < text.size(); ++at)
    if (text[at] != '\0') return false;
  return true;
}

}  // namespace

uint64_t body_bytes(const std::string& path) {
  const Fd file = open_or_throw(path, O_RDONLY);
  const uint64_t size = size_of(file, path);
  if (size < kBlockBytes)
    throw std::runtime_error(path + ": " + std::to_string(size) +
                             " bytes, shorter than its seal block");
  return size - kBlockBytes;
}

uint64_t body_sum(const std::string& path, uint64_t begin, uint64_t end) {
  if (begin > end) throw std::invalid_argument("seal::body_sum: begin > end");
  const Fd file = open_or_throw(path, O_RDONLY);
  return sum_range(file, path, begin, end);
}

void write(const std::string& path, uint64_t sum, uint64_t bytes) {
  std::string block = seal_text(checksum_finish(sum, bytes), bytes);
  block.resize(kBlockBytes, '\0');
  const Fd file = open_or_throw(path, O_WRONLY);
  const char* data = block.data();
  uint64_t left = kBlockBytes;
  off_t offset = 0;
  while (left > 0) {
    const ssize_t put = ::pwrite(file.fd, data, left, offset);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) throw std::runtime_error(path + ": cannot write its seal (" + os_error() + ")");
    if (put == 0) throw std::runtime_error(path + ": cannot write its seal (nothing written)");
    data += put;
    left -= static_cast<uint64_t>(put);
    offset += put;
  }
  // Durable before the writer renames the file into place: a crash must not leave a named file
  // whose seal never reached the disk.
  if (::fsync(file.fd) != 0)
    throw std::runtime_error(path + ": cannot sync its seal (" + os_error() + ")");
}

void seal(const std::string& path) {
  const uint64_t bytes = body_bytes(path);
  write(path, body_sum(path, 0, bytes), bytes);
}

void verify(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) throw UserError(path + ": no such file");
    throw UserError(path + ": cannot open (" + os_error() + ")");
  }
  if (S_ISDIR(info.st_mode)) throw UserError(path + ": is a directory, not a Tessera file");
  Fd file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0) throw UserError(path + ": cannot open (" + os_error() + ")");
  try {
    const uint64_t size = size_of(file, path);
    unsigned char block[kBlockBytes] = {0};
    if (size < kBlockBytes) {
      read_at(file, path, block, size, 0);
      if (size >= sizeof(kHdf5Signature) && std::memcmp(block, kHdf5Signature, 8) == 0)
        throw UserError(path + ": " + unsealed_reason(block));
      throw UserError(path + ": " + std::to_string(size) +
                      " bytes: not a Tessera file (truncated, or not a file Tessera wrote?)");
    }
    read_at(file, path, block, kBlockBytes, 0);
    uint64_t stored = 0, bytes = 0;
    if (!parse(block, stored, bytes)) throw UserError(path + ": " + unsealed_reason(block));
    const uint64_t body = size - kBlockBytes;
    if (body != bytes)
      throw UserError(path + ": " + (body < bytes ? "truncated" : "longer than it was written") +
                      ": its seal says " + std::to_string(kBlockBytes + bytes) +
                      " bytes, the file has " + std::to_string(size) + " (copy it again)");
    constexpr uint64_t kAnnounceBytes = uint64_t{1} << 30;  // seconds of reading: say so
    if (body >= kAnnounceBytes)
      spdlog::info("{}: checking its seal ({:.1f} GiB)", path,
                   static_cast<double>(body) / static_cast<double>(kAnnounceBytes));
    const uint64_t computed = checksum_finish(sum_range(file, path, 0, body), body);
    if (computed != stored)
      throw UserError(path + ": damaged: its checksum is " + hex(computed) + ", its seal says " +
                      hex(stored) + " (the file changed after Tessera wrote it; copy it again or "
                      "write it anew)");
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const UserError*>(&e)) throw;
    throw UserError(e.what());
  }
}

}  // namespace tessera::data::seal
