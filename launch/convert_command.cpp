// `tessera convert INPUT --out FILE.h5` imports Blender/NeRF-synthetic, nerfstudio/instant-ngp or
// COLMAP data; `tessera convert FILE.h5 --to nerfstudio DIR` exports (docs/datasets.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "distributed/errors.h"
#include "framework/data/import.h"
#include "launch/cli_output.h"
#include "launch/commands.h"

namespace tessera::launch {

namespace {

namespace fs = std::filesystem;

constexpr const char* kExportFormats[] = {"nerfstudio"};
constexpr int kMaxSplitEvery = 1000000;  // a bound for the help text (past the count: image 0 only)
constexpr int kMaxDownscale = 64;        // beyond this a dataset image is a few pixels wide

struct ConvertOptions {
  std::string input;
  std::string out;
  std::vector<std::string> to;  // FORMAT DIR
  data::ImportOptions import;
};

int run_import(const ConvertOptions& options) {
  ProgressLine progress("convert: wrote", "images");
  // Everything is read and checked before the output is touched.
  const data::ImportedScene scene = data::read_source(options.input, options.import);
  ensure_parent_folder(options.out, "--out");
  data::write_scene(scene, options.out,
                    [&](size_t done, size_t total) { progress(done, total); });
  size_t per_split[3] = {0, 0, 0};
  bool uniform = true;
  for (const auto& camera : scene.cameras) {
    ++per_split[static_cast<int>(camera.split)];
    uniform = uniform && camera.width == scene.cameras[0].width &&
              camera.height == scene.cameras[0].height;
  }
  std::error_code ignored;
  const auto bytes = fs::file_size(options.out, ignored);
  std::printf("convert: wrote %s from %s: %zu cameras (%zu train, %zu val, %zu test) at %s%dx%d%s, "
              "%s, %lld points, near %.3g far %.3g, %s, %.1f s\n",
              options.out.c_str(), scene.meta.source.c_str(), scene.cameras.size(), per_split[0],
              per_split[1], per_split[2], uniform ? "" : "up to ", scene.cameras[0].width,
              scene.cameras[0].height, uniform ? "" : " (sizes differ)",
              scene.has_alpha ? "rgb + alpha" : "rgb",
              static_cast<long long>(scene.points_xyz.size(0)), scene.meta.near, scene.meta.far,
              human_bytes(bytes == static_cast<uintmax_t>(-1) ? 0 : bytes).c_str(),
              progress.seconds());
  return kExitOk;
}

int run_export(const ConvertOptions& options) {
  const std::string& format = options.to[0];
  if (std::find(std::begin(kExportFormats), std::end(kExportFormats), format) ==
      std::end(kExportFormats))
    throw UserError("--to " + format + ": unknown export format (known: nerfstudio)");
  ProgressLine progress("convert: exported", "images");
  data::export_nerfstudio(options.input, options.to[1],
                          [&](size_t done, size_t total) { progress(done, total); });
  std::printf("convert: exported %s to %s (nerfstudio transforms.json), %.1f s\n",
              options.input.c_str(), options.to[1].c_str(), progress.seconds());
  return kExitOk;
}

}  // namespace

Command add_convert_command(CLI::App& app) {
  auto options = std::make_shared<ConvertOptions>();
  CLI::App* sub = app.add_subcommand(
      "convert", "Import a Blender/NeRF-synthetic, nerfstudio/instant-ngp or COLMAP dataset into "
                 "a tessera-scene file (--out), or export one to nerfstudio (--to); see "
                 "docs/datasets.md");
  sub->add_option("input", options->input,
                  "What to convert: a dataset folder (or a transforms.json) to import, or a "
                  "tessera-scene .h5 file to export with --to")
      ->required()
      ->type_name("INPUT");
  auto* out = sub->add_option("--out", options->out,
                              "Import: the tessera-scene file to write (.h5); written under a "
                              "temporary name and renamed when complete; an existing file is "
                              "replaced (default: none, one of --out or --to is required)")
                   ->type_name("FILE.h5");
  auto* to = sub->add_option("--to", options->to,
                             "Export: FORMAT DIR, e.g. --to nerfstudio out/ (the folder must be new "
                             "or empty; default: none)")
                 ->expected(2)
                 ->type_name("FORMAT DIR");
  out->excludes(to);
  auto* downscale = sub->add_option("--downscale", options->import.downscale,
                                    "Import: box-downscale images by this integer factor; "
                                    "intrinsics are divided by it")
                        ->check(CLI::Range(1, kMaxDownscale))
                        ->capture_default_str();
  auto* split_every = sub->add_option("--split-every", options->import.split_every,
                                      "Import: every N-th image (0, N, 2N, ...) is val when the "
                                      "source names no splits (nerfstudio, Mip-NeRF 360)")
                          ->check(CLI::Range(2, kMaxSplitEvery))
                          ->capture_default_str();
  auto* images = sub->add_option("--images", options->import.images_dir,
                                 "Import, COLMAP: the folder of the images the model names "
                                 "(default: INPUT/images)")
                     ->type_name("DIR");
  auto* images_scaled =
      sub->add_flag("--images-scaled", options->import.images_scaled,
                    "Import, nerfstudio/instant-ngp and COLMAP: the images were resized from the "
                    "size the file gives (e.g. a folder downscaled by 4); scale each camera's "
                    "intrinsics to its image (exactly 1/K for a K-fold downscale) instead of "
                    "refusing it; an aspect change is still refused. --downscale applies on top. "
                    "No effect on Blender, whose sizes come from the images");
  auto* keep = sub->add_flag(
      "--keep-coordinates", [options](int64_t) { options->import.normalize = false; },
      "Import, nerfstudio/instant-ngp and COLMAP: keep the capture's own coordinates instead of "
      "centering and scaling the scene into the canonical box the models expect (default: "
      "normalize and record the transform; docs/datasets.md, \"Scene normalization\")");
  for (auto* import_only : {downscale, split_every, images, images_scaled, keep})
    to->excludes(import_only);
  return {sub, [options, out, to] {
            if (to->count() > 0) return run_export(*options);
            if (out->count() == 0)
              throw UserError("convert: give --out FILE.h5 (import) or --to nerfstudio DIR "
                              "(export)");
            return run_import(*options);
          }};
}

}  // namespace tessera::launch
