// The driver that runs a fuzz target without libFuzzer: each argument is an input file or a
// folder of them (read recursively, in name order), and each input goes once through
// LLVMFuzzerTestOneInput. CTest runs it over the seed corpus and the committed regression inputs
// (tests/fuzz/regressions/TARGET), in every build, so a fixed finding stays fixed; a finding
// aborts the process and fails the test. `--if-exists DIR` names a folder that may be absent.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const bool optional = arg == "--if-exists";
    if (optional) {
      if (++i == argc) {
        std::fprintf(stderr, "--if-exists needs a folder\n");
        return 2;
      }
      arg = argv[i];
    }
    const fs::path path(arg);
    if (fs::is_directory(path)) {
      for (const auto& entry : fs::recursive_directory_iterator(path))
        if (entry.is_regular_file()) inputs.push_back(entry.path());
    } else if (fs::is_regular_file(path)) {
      inputs.push_back(path);
    } else if (!optional) {
      std::fprintf(stderr, "%s: no such input file or folder\n", arg.c_str());
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s INPUT... [--if-exists FOLDER]: no inputs given\n", argv[0]);
    return 2;
  }
  LLVMFuzzerInitialize(&argc, &argv);
  for (const fs::path& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", input.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%zu inputs replayed without a finding\n", inputs.size());
  return 0;
}
