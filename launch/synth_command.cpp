// `tessera synth --preset NAME --out FILE.h5`: renders a procedural scene with the exact analytic
// ray caster (framework/data/synth.h) into a tessera-scene dataset, with progress and a summary.
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "distributed/errors.h"
#include "framework/data/synth.h"
#include "launch/cli_output.h"
#include "launch/commands.h"

namespace tessera::launch {

namespace {

namespace synth = data::synth;

struct SynthCommandOptions {
  synth::SynthOptions synth;
  std::string out;
  std::string distortion;  // "K1,K2,P1,P2" as given; "" keeps pinhole cameras
};

// Parses `--distortion K1,K2,P1,P2`: exactly four numbers, comma-separated (spaces allowed).
std::array<double, 4> parse_distortion(const std::string& text) {
  const std::string usage = "--distortion expects four comma-separated numbers K1,K2,P1,P2 "
                            "(OpenCV order), e.g. --distortion=-0.1,0.01,0,0; got '" + text + "'";
  std::array<double, 4> values{};
  size_t begin = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t end = i < 3 ? text.find(',', begin) : text.size();
    if (end == std::string::npos) throw UserError(usage);
    const std::string field = text.substr(begin, end - begin);
    char* stop = nullptr;
    values[i] = std::strtod(field.c_str(), &stop);
    while (stop && (*stop == ' ' || *stop == '\t')) ++stop;
    if (field.find_first_not_of(" \t") == std::string::npos || stop != field.c_str() + field.size())
      throw UserError(usage);
    begin = end + 1;  // the last field runs to the end, so a fifth number fails above
  }
  return values;
}

int run_synth(SynthCommandOptions options) {
  if (!options.distortion.empty()) options.synth.distortion = parse_distortion(options.distortion);
  synth::validate_options(options.synth);  // before any output or file is touched
  ensure_parent_folder(options.out, "--out");
  ProgressLine progress("synth:", "views");
  const synth::SynthSummary summary = synth::write_synth_scene(
      options.synth, options.out, [&](size_t done, size_t total) { progress(done, total); });
  const auto& s = summary.views_per_split;
  std::printf("synth: wrote %s: preset %s, %zu views (%zu train, %zu val, %zu test) at %dx%d, "
              "%lld points, %s, %.1f s\n",
              options.out.c_str(), options.synth.preset.c_str(), s[0] + s[1] + s[2], s[0], s[1],
              s[2], options.synth.width, options.synth.height,
              static_cast<long long>(summary.points), human_bytes(summary.file_bytes).c_str(),
              summary.seconds);
  return kExitOk;
}

}  // namespace

Command add_synth_command(CLI::App& app) {
  auto options = std::make_shared<SynthCommandOptions>();
  std::string presets;
  for (const auto& name : synth::preset_names()) presets += (presets.empty() ? "" : ", ") + name;
  CLI::App* sub = app.add_subcommand(
      "synth", "Render a procedural scene with an exact ray caster into a tessera-scene dataset "
               "(see docs/synth.md)");
  sub->add_option("--preset", options->synth.preset, "Scene preset: " + presets)
      ->capture_default_str();
  sub->add_option("--out", options->out, "Output dataset file (.h5); written atomically")
      ->required();
  sub->add_option("--views", options->synth.views,
                  "Number of views: view i is val when i % 8 == 0, test when i % 8 == 4, else train "
                  "(at least " +
                      std::to_string(synth::kMinViews) + "))")
      ->capture_default_str();
  sub->add_option("--width", options->synth.width,
                  "Image width in pixels (" + std::to_string(synth::kMinSide) + " to " +
                      std::to_string(synth::kMaxSide) + ")")
      ->capture_default_str();
  sub->add_option("--height", options->synth.height,
                  "Image height in pixels (" + std::to_string(synth::kMinSide) + " to " +
                      std::to_string(synth::kMaxSide) + ")")
      ->capture_default_str();
  sub->add_option("--seed", options->synth.seed,
                  "Random seed: the objects, textures and camera jitter are a pure function of "
                  "(preset, views, size, seed)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--distortion", options->distortion,
                  "Lens distortion of every camera, OpenCV K1,K2,P1,P2 (e.g. "
                  "--distortion=-0.1,0.01,0,0): images are rendered through the distorted pixels, "
                  "like a raw capture. It must be invertible over the whole image. Default: none");
  return {sub, [options] { return run_synth(*options); }};
}

}  // namespace tessera::launch
