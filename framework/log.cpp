// Builds the rank-tagged spdlog logger: a terminal sink (full on rank 0, errors only elsewhere)
// and one file per rank under RUN_DIR/logs.
#include "framework/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "distributed/errors.h"

namespace tessera::log {

namespace {
constexpr const char* kLevelNames[] = {"trace", "debug", "info", "warn", "error"};
}  // namespace

spdlog::level::level_enum parse_level(const std::string& level) {
  if (level == "trace") return spdlog::level::trace;
  if (level == "debug") return spdlog::level::debug;
  if (level == "info") return spdlog::level::info;
  if (level == "warn") return spdlog::level::warn;
  if (level == "error") return spdlog::level::err;
  std::string known;
  for (const char* name : kLevelNames) known += std::string(known.empty() ? "" : ", ") + name;
  throw UserError("unknown log level '" + level + "' (known: " + known + ")");
}

std::string log_file_path(const std::string& run_dir, int rank) {
  return (std::filesystem::path(run_dir) / "logs" / ("rank-" + std::to_string(rank) + ".log"))
      .string();
}

void init(const LogOptions& options) {
  const spdlog::level::level_enum level = parse_level(options.level);
  std::vector<spdlog::sink_ptr> sinks;
  if (options.terminal) {
    auto terminal = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    // Other ranks stay quiet on the terminal unless something is wrong.
    terminal->set_level(options.rank == 0 ? spdlog::level::trace : spdlog::level::err);
    sinks.push_back(terminal);
  }
  if (!options.run_dir.empty()) {
    const std::string path = log_file_path(options.run_dir, options.rank);
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false));
    } catch (const spdlog::spdlog_ex& e) {
      throw UserError("cannot create log file " + path + ": " + e.what() +
                      " (check that run.out_dir is writable)");
    }
  }
  auto logger = std::make_shared<spdlog::logger>("tessera", sinks.begin(), sinks.end());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [rank " + std::to_string(options.rank) +
                      "] [%^%l%$] %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

void set_level(const std::string& level) { spdlog::default_logger()->set_level(parse_level(level)); }

void flush() {
  if (auto logger = spdlog::default_logger()) logger->flush();
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof(text), "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(text, sizeof(text), "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(text, sizeof(text), "%llds", (long long)s);
  return text;
}

}  // namespace tessera::log
