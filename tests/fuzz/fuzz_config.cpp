// Fuzz target: the TOML config parser with --set overrides (framework/config.h).
// Input: TOML text, then kFileSeparator and one override per line ("section.key=value").
// Checks: parse_config and parse_stored_config accept or raise UserError; an accepted config
// written back by to_toml parses again to the same text (the round trip the docs promise).
#include "framework/config.h"
#include "framework/family.h"
#include "models/builtin.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

std::vector<std::string> lines_of(const std::string& text, size_t max_lines) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin <= text.size() && lines.size() < max_lines) {
    const size_t end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return lines;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::init_torch();
  static tessera::FamilyRegistry families;  // the families' sections belong to the schema
  tessera::models::register_builtin_families(families);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const auto parts = fuzz::split_input(data, size, 2);
  const std::vector<std::string> overrides =
      parts.size() > 1 ? lines_of(parts[1], 16) : std::vector<std::string>{};
  Config config;
  if (fuzz::accepts("parse_config", [&] { config = parse_config(parts[0], "fuzz.toml", overrides); })) {
    const std::string text = to_toml(config);
    Config again;
    try {
      again = parse_config(text, "fuzz.toml (written back)");
    } catch (const std::exception& e) {
      fuzz::finding("to_toml wrote a config that parse_config refuses: " + std::string(e.what()) +
                    "\n--- written ---\n" + text);
    }
    if (to_toml(again) != text)
      fuzz::finding("to_toml does not round-trip:\n--- first ---\n" + text + "\n--- second ---\n" +
                    to_toml(again));
  }
  fuzz::accepts("parse_stored_config",
                [&] { (void)parse_stored_config(parts[0], "fuzz snapshot config", overrides); });
  return 0;
}
