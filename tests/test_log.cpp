// Tests of the rank-tagged logger: lines land in RUN_DIR/logs/rank-N.log with rank and level,
// level filtering and set_level, parse_level's names, and UserError for bad levels or paths.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "distributed/errors.h"
#include "tests/test_util.h"
#include "framework/log.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::lines_of;
using test::read_file;
using test::remove_tree;

// A fresh directory under the test temp dir, removed at the end of the test.
class TempRunDir {
 public:
  TempRunDir() {
    std::string pattern = (fs::path(testing::TempDir()) / "tessera_log_XXXXXX").string();
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    const char* made = mkdtemp(buffer.data());
    if (!made) ADD_FAILURE() << "mkdtemp failed for " << pattern;
    path_ = made ? made : pattern;
  }
  ~TempRunDir() {
    remove_tree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The line of `text` containing `needle`, or "" when none does.
std::string line_with(const std::string& text, const std::string& needle) {
  for (const std::string& line : lines_of(text))
    if (line.find(needle) != std::string::npos) return line;
  return "";
}

// log::init does not create RUN_DIR/logs; train_command.cpp creates it first, and so do we.
void init_file_logger(const std::string& run_dir, int rank, const std::string& level) {
  fs::create_directories(fs::path(run_dir) / "logs");
  log::init({rank, level, run_dir, /*terminal=*/false});
}

TEST(Log, FilePathIsUnderLogsDir) {
  EXPECT_EQ(log::log_file_path("/some/run", 3), (fs::path("/some/run") / "logs" / "rank-3.log").string());
  EXPECT_EQ(log::log_file_path("rel", 0), (fs::path("rel") / "logs" / "rank-0.log").string());
}

TEST(Log, InfoLineLandsInRankFileWithRankAndLevel) {
  TempRunDir dir;
  init_file_logger(dir.path(), 3, "info");
  spdlog::info("hello from the log test {}", 42);
  log::flush();

  const std::string path = (fs::path(dir.path()) / "logs" / "rank-3.log").string();
  ASSERT_TRUE(fs::exists(path)) << path;
  EXPECT_EQ(log::log_file_path(dir.path(), 3), path);
  const std::string text = read_file(path);
  const std::string line = line_with(text, "hello from the log test 42");
  ASSERT_FALSE(line.empty()) << "log file:\n" << text;
  EXPECT_NE(line.find("[rank 3]"), std::string::npos) << line;
  EXPECT_NE(line.find("[info]"), std::string::npos) << line;
  // Nothing was written for other ranks.
  EXPECT_FALSE(fs::exists(fs::path(dir.path()) / "logs" / "rank-0.log"));
}

TEST(Log, LevelFiltersAndSetLevelChangesIt) {
  TempRunDir dir;
  init_file_logger(dir.path(), 3, "info");
  spdlog::debug("debug line before set_level");
  spdlog::warn("warn line at info level");
  log::set_level("debug");
  spdlog::debug("debug line after set_level");
  log::set_level("error");
  spdlog::warn("warn line at error level");
  spdlog::error("error line at error level");
  log::flush();

  const std::string text = read_file(log::log_file_path(dir.path(), 3));
  EXPECT_TRUE(line_with(text, "debug line before set_level").empty()) << text;
  const std::string warn = line_with(text, "warn line at info level");
  ASSERT_FALSE(warn.empty()) << text;
  EXPECT_NE(warn.find("[warning]"), std::string::npos) << warn;
  const std::string debug = line_with(text, "debug line after set_level");
  ASSERT_FALSE(debug.empty()) << text;
  EXPECT_NE(debug.find("[debug]"), std::string::npos) << debug;
  EXPECT_NE(debug.find("[rank 3]"), std::string::npos) << debug;
  EXPECT_TRUE(line_with(text, "warn line at error level").empty()) << text;
  const std::string error = line_with(text, "error line at error level");
  ASSERT_FALSE(error.empty()) << text;
  EXPECT_NE(error.find("[error]"), std::string::npos) << error;
}

TEST(Log, InitAppendsToExistingFile) {
  TempRunDir dir;
  init_file_logger(dir.path(), 1, "info");
  spdlog::info("first run line");
  log::flush();
  init_file_logger(dir.path(), 1, "info");
  spdlog::info("second run line");
  log::flush();
  const std::string text = read_file(log::log_file_path(dir.path(), 1));
  EXPECT_FALSE(line_with(text, "first run line").empty()) << text;
  EXPECT_FALSE(line_with(text, "second run line").empty()) << text;
}

TEST(Log, InitWithUnknownLevelThrows) {
  TempRunDir dir;
  fs::create_directories(fs::path(dir.path()) / "logs");
  EXPECT_THROW(log::init({0, "loud", dir.path(), false}), UserError);
}

TEST(Log, ParseLevelKnowsEveryName) {
  EXPECT_EQ(log::parse_level("trace"), spdlog::level::trace);
  EXPECT_EQ(log::parse_level("debug"), spdlog::level::debug);
  EXPECT_EQ(log::parse_level("info"), spdlog::level::info);
  EXPECT_EQ(log::parse_level("warn"), spdlog::level::warn);
  EXPECT_EQ(log::parse_level("error"), spdlog::level::err);
}

TEST(Log, ParseLevelUnknownNameListsKnownNames) {
  for (const std::string bad : {"loud", "", "INFO", "warning", "err"}) {
    try {
      log::parse_level(bad);
      ADD_FAILURE() << "parse_level('" << bad << "') did not throw";
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("'" + bad + "'"), std::string::npos) << message;
      for (const char* name : {"trace", "debug", "info", "warn", "error"})
        EXPECT_NE(message.find(name), std::string::npos) << "missing " << name << " in: " << message;
    }
  }
}

TEST(Log, UncreatableRunDirThrowsUserError) {
  TempRunDir dir;
  // A regular file where a directory should be: nothing can be created under it.
  const std::string blocker = (fs::path(dir.path()) / "not_a_dir").string();
  std::ofstream(blocker) << "x";
  ASSERT_TRUE(fs::is_regular_file(blocker));
  const std::string run_dir = (fs::path(blocker) / "run").string();
  try {
    log::init({2, "info", run_dir, false});
    ADD_FAILURE() << "log::init under a regular file did not throw";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(log::log_file_path(run_dir, 2)), std::string::npos)
        << e.what();
  }
}

TEST(Log, NoRunDirWritesNoFile) {
  TempRunDir dir;
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  log::init({0, "info", "", false});
  spdlog::info("no file for this line");
  log::flush();
  fs::current_path(cwd);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

}  // namespace
}  // namespace tessera
