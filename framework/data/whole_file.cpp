// Files written whole or not at all (framework/data/whole_file.h).
#include "framework/data/whole_file.h"

#include <cstdio>
#include <filesystem>

#include "distributed/errors.h"

namespace tessera::data {

void write_whole_file_with(const std::string& path, const std::string& what,
                           const std::function<bool(const std::string& partial)>& write) {
  const std::string partial = path + ".partial";
  std::error_code ec;
  bool written = false;
  try {
    written = write(partial);
  } catch (...) {
    std::filesystem::remove(partial, ec);
    throw;
  }
  if (!written) {
    std::filesystem::remove(partial, ec);
    throw UserError("cannot write " + what + " " + path +
                    " (check that the folder exists and is writable, and the free space)");
  }
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    std::filesystem::remove(partial, ec);
    throw UserError("cannot write " + what + " " + path + " (" + ec.message() + ")");
  }
}

void write_whole_file(const std::string& path, const std::string& bytes, const std::string& what) {
  write_whole_file_with(path, what, [&](const std::string& partial) {
    std::FILE* file = std::fopen(partial.c_str(), "wb");
    if (!file) return false;
    const bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
    return (std::fclose(file) == 0) && wrote;
  });
}

}  // namespace tessera::data
