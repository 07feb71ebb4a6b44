// Fuzz target: the transforms.json importers (framework/data/import.h): nerfstudio/instant-ngp
// (parse_transforms) and Blender (parse_blender, the same text as transforms_train.json), each
// followed by finish_import (image headers against cameras, normalization, bounds, near/far).
// Input: the JSON text. The folder beside it holds what the seeds refer to (tests/fuzz/
// write_seeds.cpp): images/0.png .. images/3.png (16 x 12 RGB, 3 with alpha), images/4.jpg and
// points3D.ply. Checks: each step accepts or raises UserError; an accepted import passes
// fuzz::check_import.
#include "framework/data/import.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/fuzz_fixtures.h"

namespace {

void import_and_check(const char* what, const std::function<tessera::data::ParsedSource()>& parse) {
  tessera::data::ParsedSource parsed;
  if (tessera::fuzz::accepts(what, [&] { parsed = parse(); })) tessera::fuzz::check_import(what, parsed);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::init_torch();
  tessera::fuzz::write_transforms_assets(tessera::fuzz::scratch_dir() + "/transforms");
  tessera::fuzz::write_transforms_assets(tessera::fuzz::scratch_dir() + "/blender");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string json_path = fuzz::scratch_dir() + "/transforms/transforms.json";
  fuzz::write_bytes(json_path, data, size);
  import_and_check("parse_transforms", [&] { return data::parse_transforms(json_path, 8); });
  const std::string blender = fuzz::scratch_dir() + "/blender";
  fuzz::write_bytes(blender + "/transforms_train.json", data, size);
  import_and_check("parse_blender", [&] { return data::parse_blender(blender); });
  return 0;
}
