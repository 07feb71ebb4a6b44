// Small file and text helpers shared by the tests (header-only).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::test {

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

}  // namespace tessera::test
