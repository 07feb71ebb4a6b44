// Fuzz target: the COLMAP importers, text and binary (framework/data/import.h parse_colmap), then
// finish_import (image headers against cameras, normalization, bounds, near/far).
// Input: one byte, 'b' for the binary model (anything else: text), then cameras, images and
// points3D, separated by kFileSeparator (a missing points3D is allowed, as in COLMAP's output).
// The images the seeds name are the COLMAP fixture's (tests/import_fixtures.h). Checks: each
// step accepts or raises UserError; an accepted import passes fuzz::check_import.
#include "framework/data/import.h"
#include "tests/fuzz/fuzz_fixtures.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::init_torch();
  (void)tessera::fuzz::write_colmap_assets(tessera::fuzz::scratch_dir() + "/colmap");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  if (size == 0) return 0;
  const bool binary = data[0] == 'b';
  const auto parts = fuzz::split_input(data + 1, size - 1, 3);
  const std::string root = fuzz::scratch_dir() + "/colmap";
  const std::string model = root + "/sparse";
  std::filesystem::remove_all(model);
  const char* names[] = {"cameras", "images", "points3D"};
  for (size_t i = 0; i < parts.size(); ++i)
    fuzz::write_bytes(model + "/" + names[i] + (binary ? ".bin" : ".txt"), parts[i].data(),
                      parts[i].size());
  data::ParsedSource parsed;
  if (!fuzz::accepts("parse_colmap", [&] { parsed = data::parse_colmap(model, root + "/images", 8); }))
    return 0;
  fuzz::check_import("parse_colmap", parsed);
  return 0;
}
