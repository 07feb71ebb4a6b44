// Small file and text helpers shared by the tests (header-only).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/errors.h"

namespace tessera::test {

// Runs `fn`, expects a UserError, and returns its message ("" and a test failure otherwise).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

// Deletes `path` and everything under it. Also guards the link order of cmake/TesseraTorch.cmake:
// libtorch.so exports a broken copy of std::filesystem::remove_all that would crash here if it
// were bound before libstdc++'s.
inline void remove_tree(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

// The whole file as bytes; "" when it cannot be read.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// What a command run through /bin/sh gave.
struct CommandResult {
  int exit_code = -1;  // the exit status; 128 + signal when killed by a signal; -1: not run
  std::string out;     // stdout
  std::string err;     // stderr
};

inline std::string describe(const CommandResult& r) {
  return "exit code " + std::to_string(r.exit_code) + "\n--- stdout ---\n" + r.out +
         "--- stderr ---\n" + r.err;
}

// Single-quotes `text` for /bin/sh.
inline std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Runs `command` with /bin/sh, stdin from /dev/null, stdout and stderr captured separately
// through files in `scratch_dir` (removed afterwards).
inline CommandResult run_shell(const std::string& command, const std::string& scratch_dir) {
  const std::string out_path = scratch_dir + "/stdout.txt", err_path = scratch_dir + "/stderr.txt";
  const std::string full =
      "( " + command + " ) >" + quote(out_path) + " 2>" + quote(err_path) + " </dev/null";
  CommandResult result;
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return result;
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  else if (status != -1 && WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  std::error_code ignored;
  std::filesystem::remove(out_path, ignored);
  std::filesystem::remove(err_path, ignored);
  return result;
}

}  // namespace tessera::test
