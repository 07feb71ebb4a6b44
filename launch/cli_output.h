// Terminal output shared by the subcommands: byte counts for people, a progress line for long
// work, and creating the folder an output file goes into.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::launch {

// "791.1 KiB", "12 B".
std::string human_bytes(uint64_t bytes);

// Creates the parent folder of `path` when missing; throws UserError naming `flag` on failure.
void ensure_parent_folder(const std::string& path, const std::string& flag);

// Reports `done / total UNIT` with elapsed time and ETA on stderr, prefixed with `label`: one
// line rewritten in place on a terminal, otherwise a line every tenth of the work, so that logs
// of batch jobs stay short.
class ProgressLine {
 public:
  ProgressLine(std::string label, std::string unit);
  void operator()(size_t done, size_t total);
  double seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  std::string unit_;
  bool tty_;
  Clock::time_point start_;
  size_t next_report_ = 0;
};

}  // namespace tessera::launch
