// `tessera synth --preset NAME --out FILE.h5`: renders a procedural scene with the exact analytic
// ray caster (framework/data/synth.h) into a tessera-scene dataset, with progress and a summary.
#include <chrono>
#include <cstdio>
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
};

int run_synth(const SynthCommandOptions& options) {
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
  return {sub, [options] { return run_synth(*options); }};
}

}  // namespace tessera::launch
