// Byte formatting, the progress line and output-folder creation shared by the subcommands.
#include "launch/cli_output.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>

#include "distributed/errors.h"

namespace tessera::launch {

namespace {
// Without a terminal, one progress line per this fraction of the work (log files stay short).
constexpr double kLogProgressStep = 0.1;
}  // namespace

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) value /= 1024, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

void ensure_parent_folder(const std::string& path, const std::string& flag) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty() || std::filesystem::exists(parent)) return;
  std::error_code error;
  std::filesystem::create_directories(parent, error);
  if (error)
    throw UserError("cannot create the folder " + parent.string() + " for " + flag + ": " +
                    error.message());
}

ProgressLine::ProgressLine(std::string label, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), tty_(isatty(fileno(stderr)) != 0),
      start_(Clock::now()) {}

double ProgressLine::seconds() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void ProgressLine::operator()(size_t done, size_t total) {
  const double elapsed = seconds();
  const double eta = done > 0 ? elapsed * static_cast<double>(total - done) / done : 0.0;
  const auto step = static_cast<size_t>(kLogProgressStep * static_cast<double>(total));
  if (!tty_ && done != total && done < next_report_) return;
  next_report_ = done + std::max<size_t>(1, step);
  std::fprintf(stderr, "%s%s %zu/%zu %s, %.1f s elapsed, ETA %.1f s%s", tty_ ? "\r" : "",
               label_.c_str(), done, total, unit_.c_str(), elapsed, eta, tty_ ? "\033[K" : "\n");
  if (tty_ && done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace tessera::launch
