// Shared by the fuzz targets (tests/fuzz/fuzz_*.cpp, docs/testing.md "Fuzzing"): each reader
// gets the fuzzer's bytes as a file in a scratch folder, and every target checks the same rule:
// a reader either succeeds or throws UserError (exit 2 with a message naming the file). Any other
// exception, a crash, a leak or a sanitizer report is a finding; `finding` aborts so that
// libFuzzer (and the replay driver under CTest) reports it with the input.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distributed/errors.h"

namespace tessera::fuzz {

// Separates the files of a multi-file input (COLMAP's three, a config and its overrides). It is
// in each such target's dictionary, so the fuzzer finds it.
constexpr const char kFileSeparator[] = "\n--tessera-fuzz-next-file--\n";

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// This process's scratch folder, created on first use ($TMPDIR or /tmp) and removed at exit.
// Never destroyed (the exit handler still needs it after static destructors have begun).
inline const std::string& scratch_dir() {
  static const std::string* const dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    const std::filesystem::path root = tmp && *tmp ? tmp : "/tmp";
    const auto path = root / ("tessera-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_dir(), ignored);
    });
    return new std::string(path.string());
  }();
  return *dir;
}

// Writes `size` bytes to `path` (folders created), replacing what was there.
inline void write_bytes(const std::string& path, const void* data, size_t size) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) finding("cannot write the input to " + path);
}

// The input cut at each kFileSeparator, at most `max_parts` parts (the last keeps the rest).
inline std::vector<std::string> split_input(const uint8_t* data, size_t size, size_t max_parts) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const std::string sep = kFileSeparator;
  std::vector<std::string> parts;
  size_t begin = 0;
  while (parts.size() + 1 < max_parts) {
    const size_t at = all.find(sep, begin);
    if (at == std::string::npos) break;
    parts.push_back(all.substr(begin, at - begin));
    begin = at + sep.size();
  }
  parts.push_back(all.substr(begin));
  return parts;
}

// Runs `read`; a UserError is the expected answer to bad input, anything else is a finding.
// With TESSERA_FUZZ_VERBOSE=1 in the environment each refusal is printed (to see how far the
// seeds and regression inputs get).
template <typename Fn>
bool accepts(const char* target, Fn&& read) {
  try {
    read();
    return true;
  } catch (const UserError& e) {
    static const bool verbose = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "  %s refused: %s\n", target, e.what());
    return false;
  } catch (const std::exception& e) {
    finding(std::string(target) + ": bad input must raise UserError, got: " + e.what());
  } catch (...) {
    finding(std::string(target) + ": bad input must raise UserError, got a non-standard exception");
  }
}

// One intra-op thread: inputs are tiny, and a fuzzer's executions per second matter more.
inline void init_torch() { torch::set_num_threads(1); }

}  // namespace tessera::fuzz
