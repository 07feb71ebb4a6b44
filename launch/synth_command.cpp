// `tessera synth --preset NAME --out FILE.h5`: renders a procedural scene with the exact analytic
// ray caster (framework/data/synth.h) into a tessera-scene dataset, or with `--preset shapes`
// samples procedural shapes into a tessera-shapes dataset (framework/data/shapes.h), with progress
// and a summary.
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "distributed/errors.h"
#include "framework/data/shapes.h"
#include "framework/data/synth.h"
#include "launch/cli_output.h"
#include "launch/commands.h"

namespace tessera::launch {

namespace {

namespace synth = data::synth;

constexpr const char* kShapesPreset = "shapes";

struct SynthCommandOptions {
  synth::SynthOptions synth;
  data::shapes::GenerateOptions shapes;
  std::string out;
  std::string distortion;  // "K1,K2,P1,P2" as given; "" keeps pinhole cameras
  std::vector<CLI::Option*> scene_flags;   // given with --preset shapes: refused
  std::vector<CLI::Option*> shapes_flags;  // given with a scene preset: refused
};

// The flags of `given` that were set on the command line, for the refusal message.
std::string set_flags(const std::vector<CLI::Option*>& given) {
  std::string names;
  for (const CLI::Option* option : given)
    if (option->count() > 0) names += (names.empty() ? "" : ", ") + option->get_name();
  return names;
}

int run_shapes(const SynthCommandOptions& options) {
  if (const std::string extra = set_flags(options.scene_flags); !extra.empty())
    throw UserError(extra + ": scene flags; --preset shapes takes --count, --points and --seed");
  data::shapes::GenerateOptions shapes = options.shapes;
  shapes.seed = options.synth.seed;
  data::shapes::validate(shapes);  // before any output or file is touched
  ensure_parent_folder(options.out, "--out");
  ProgressLine progress("synth:", "shapes");
  const data::shapes::GenerateSummary summary = data::shapes::write_generated_shapes(
      shapes, options.out, [&](int64_t done, int64_t total) { progress(done, total); });
  const auto& s = summary.per_split;
  std::printf("synth: wrote %s: preset shapes, %lld shapes (%lld train, %lld val, %lld test) of "
              "%lld points, %s, %.1f s\n",
              options.out.c_str(), static_cast<long long>(shapes.count),
              static_cast<long long>(s[0]), static_cast<long long>(s[1]),
              static_cast<long long>(s[2]), static_cast<long long>(shapes.points),
              human_bytes(summary.file_bytes).c_str(), summary.seconds);
  return kExitOk;
}

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
  if (options.synth.preset == kShapesPreset) return run_shapes(options);
  if (const std::string extra = set_flags(options.shapes_flags); !extra.empty())
    throw UserError(extra + ": flags of --preset shapes, not of the scene preset '" +
                    options.synth.preset + "'");
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
      "synth", "Render a procedural scene with an exact ray caster into a tessera-scene dataset, "
               "or sample procedural shapes into a tessera-shapes dataset (see docs/synth.md)");
  sub->add_option("--preset", options->synth.preset,
                  "Scene preset (" + presets + "), or `shapes`: surface points of procedural "
                  "shapes for point-cloud models")
      ->capture_default_str();
  sub->add_option("--out", options->out, "Output dataset file (.h5); written atomically")
      ->required();
  options->scene_flags.push_back(sub->add_option("--views", options->synth.views,
                  "Number of views: view i is val when i % 8 == 0, test when i % 8 == 4, else train "
                  "(at least " +
                      std::to_string(synth::kMinViews) + "))"));
  options->scene_flags.back()->capture_default_str();
  options->scene_flags.push_back(
      sub->add_option("--width", options->synth.width,
                      "Image width in pixels (" + std::to_string(synth::kMinSide) + " to " +
                          std::to_string(synth::kMaxSide) + ")")
          ->capture_default_str());
  options->scene_flags.push_back(
      sub->add_option("--height", options->synth.height,
                      "Image height in pixels (" + std::to_string(synth::kMinSide) + " to " +
                          std::to_string(synth::kMaxSide) + ")")
          ->capture_default_str());
  sub->add_option("--seed", options->synth.seed,
                  "Random seed: the objects, textures and camera jitter are a pure function of "
                  "(preset, views, size, seed); the shapes of (count, points, seed)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  options->scene_flags.push_back(sub->add_option("--distortion", options->distortion,
                  "Lens distortion of every camera, OpenCV K1,K2,P1,P2 (e.g. "
                  "--distortion=-0.1,0.01,0,0): images are rendered through the distorted pixels, "
                  "like a raw capture. It must be invertible over the whole image. Default: none"));
  options->shapes_flags.push_back(
      sub->add_option("--count", options->shapes.count,
                      "--preset shapes: number of shapes (" +
                          std::to_string(data::shapes::kMinCount) + " to " +
                          std::to_string(data::shapes::kMaxCount) +
                          "); shape i is val when i % 10 == 0, test when i % 10 == 5, else train")
          ->capture_default_str());
  options->shapes_flags.push_back(
      sub->add_option("--points", options->shapes.points,
                      "--preset shapes: surface points per shape (" +
                          std::to_string(data::shapes::kMinPoints) + " to " +
                          std::to_string(data::shapes::kMaxPoints) + ")")
          ->capture_default_str());
  return {sub, [options] { return run_synth(*options); }};
}

}  // namespace tessera::launch
