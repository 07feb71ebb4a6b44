// Logging for every rank: spdlog with each line tagged by the rank. Rank 0 writes to the terminal
// (stderr), every rank to RUN_DIR/logs/rank-N.log; other ranks show only errors on the terminal.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace tessera::log {

struct LogOptions {
  int rank = 0;
  std::string level = "info";  // trace, debug, info, warn, error
  std::string run_dir;         // "" = no log file
  bool terminal = true;        // false silences the terminal sink (tests)
};

// Replaces spdlog's default logger; every later spdlog::info(...) goes through it. Throws
// UserError for an unknown level or a log file that cannot be created.
void init(const LogOptions& options);
// Changes the level of the installed logger.
void set_level(const std::string& level);
// spdlog's level for a name; throws UserError listing the known names.
spdlog::level::level_enum parse_level(const std::string& level);
// Path of this rank's log file under `run_dir`.
std::string log_file_path(const std::string& run_dir, int rank);
// Flushes every sink (before exit or abort).
void flush();
// A duration for progress lines: "45s", "3m05s", "1h02m".
std::string format_duration(double seconds);

}  // namespace tessera::log
