// `tessera eval SNAPSHOT` (the family's scores per split, one JSON object), `tessera render
// SNAPSHOT --out DIR` (PNGs of a split's views or of an orbit) and `tessera sample SNAPSHOT
// --out DIR` (a generative family's samples), for every model family, on any number of ranks.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "distributed/errors.h"
#include "framework/data/image_io.h"
#include "framework/data/synth.h"
#include "framework/session.h"
#include "launch/commands.h"
#include "models/builtin.h"

namespace tessera::launch {

namespace {

struct SnapshotCommandOptions {
  std::string snapshot;
  std::string ply;    // a model trained elsewhere, instead of a snapshot
  std::string scene;  // its dataset (with --ply)
  std::vector<std::string> overrides;
  std::string split;  // eval: "" = val and test; render: default test
  std::string out;
  int orbit = 0;
  int max_views = -1;
  SampleRequest sample;  // `tessera sample`
};

// The snapshot (o.snapshot: a run folder becomes its newest snapshot), or the file of --ply on
// the dataset of --scene.
Session restore(SnapshotCommandOptions& o) {
  FamilyRegistry families;
  models::register_builtin_families(families);
  if (!o.ply.empty()) return import_session(o.ply, o.scene, o.overrides, families);
  if (o.snapshot.empty()) throw UserError("give a SNAPSHOT, or --ply FILE with --scene FILE.h5");
  o.snapshot = snapshot_argument(o.snapshot);
  return restore_session(o.snapshot, o.overrides, families);
}

int run_eval(SnapshotCommandOptions& o) {
  const Session run = restore(o);
  const std::vector<std::string> splits =
      o.split.empty() ? std::vector<std::string>{"val", "test"} : std::vector<std::string>{o.split};
  nlohmann::json result;
  if (o.ply.empty()) {
    result["snapshot"] = o.snapshot;
    result["step"] = run.step;
  } else {
    result["ply"] = o.ply;
    result["scene"] = o.scene;
  }
  result["model"] = run.config.model.name;
  result["ranks"] = run.comm->size();
  for (const std::string& split : splits) {
    std::vector<size_t> views = run.dataset->indices(data::parse_split(split, "--split"));
    if (views.empty() && o.split.empty()) continue;  // the dataset has no such split
    if (views.empty()) throw UserError(run.config.data.path + " has no " + split + " split");
    run.run->set_eval_views(split, o.max_views);
    const EvalScores r = run.run->evaluate(run.step, /*write=*/false);
    result["splits"][split] = r.to_json();
  }
  if (!result.contains("splits"))
    throw UserError(run.config.data.path + " has neither a val nor a test split; use --split train");
  if (run.comm->rank() == 0) std::cout << result.dump() << std::endl;
  return kExitOk;
}

// N cameras on a horizontal circle around the scene box's centre, at the mean distance of the
// dataset's cameras and their mean height, looking at the centre, with camera 0's intrinsics.
std::vector<data::Camera> orbit_cameras(const data::SceneReader& scene, int n) {
  const auto& b = scene.meta().scene_bounds;
  const data::synth::Vec3 center{(b[0] + b[3]) / 2, (b[1] + b[4]) / 2, (b[2] + b[5]) / 2};
  double radius = 0, height = 0;
  for (const auto& c : scene.cameras()) {
    const double dx = c.camera_to_world[3] - center.x, dy = c.camera_to_world[7] - center.y;
    radius += std::sqrt(dx * dx + dy * dy);
    height += c.camera_to_world[11];
  }
  radius /= scene.cameras().size();
  height /= scene.cameras().size();
  std::vector<data::Camera> cameras;
  for (int i = 0; i < n; ++i) {
    const double a = 2.0 * M_PI * i / n;
    data::Camera c = scene.cameras().front();
    c.k1 = c.k2 = c.p1 = c.p2 = 0;
    c.camera_to_world = data::synth::look_at(
        {center.x + radius * std::cos(a), center.y + radius * std::sin(a), height}, center);
    cameras.push_back(c);
  }
  return cameras;
}

int run_render(SnapshotCommandOptions& o) {
  const Session run = restore(o);
  const data::SceneReader* scene = run.dataset->as_scene();
  ViewRenderer* renderer = run.family->view_renderer();
  if (!scene || !renderer)
    throw UserError(run.config.data.path + ": model '" + run.config.model.name + "' trains on " +
                    run.dataset->summary() + ", not on camera views: there is nothing to render " +
                    "(`tessera eval` scores it)");
  std::vector<std::pair<std::string, data::Camera>> views;
  if (o.orbit > 0) {
    const auto cameras = orbit_cameras(*scene, o.orbit);
    for (size_t i = 0; i < cameras.size(); ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "orbit-%03zu.png", i);
      views.emplace_back(name, cameras[i]);
    }
  } else {
    const std::string split = o.split.empty() ? "test" : o.split;
    for (size_t index : scene->indices(data::parse_split(split, "--split"))) {
      char name[48];
      std::snprintf(name, sizeof name, "%s-%03zu.png", split.c_str(), index);
      views.emplace_back(name, scene->cameras()[index]);
    }
    if (views.empty())
      throw UserError(run.config.data.path + " has no " + split + " views; use --split or --orbit");
  }
  if (o.max_views >= 0 && static_cast<int>(views.size()) > o.max_views) views.resize(o.max_views);
  if (run.comm->rank() == 0) std::filesystem::create_directories(o.out);
  for (size_t i = 0; i < views.size(); ++i) {
    const torch::Tensor image = renderer->render_camera(views[i].second, run.step);
    if (run.comm->rank() != 0) continue;
    const torch::Tensor png = (image * 255.0f).round().clamp(0, 255).to(torch::kUInt8);
    data::write_png((std::filesystem::path(o.out) / views[i].first).string(), png);
    std::cerr << "\rrendered " << (i + 1) << "/" << views.size() << std::flush;
  }
  if (run.comm->rank() == 0) std::cerr << "\n" << views.size() << " images in " << o.out << "\n";
  return kExitOk;
}

int run_sample(SnapshotCommandOptions& o) {
  // Before MPI: nothing the user has is overwritten.
  namespace fs = std::filesystem;
  if (fs::exists(o.out) && !fs::is_directory(o.out))
    throw UserError("--out " + o.out + " is a file, not a folder");
  if (fs::exists(fs::path(o.out) / "sample-0000.ply"))
    throw UserError("--out " + o.out + " already holds samples (sample-0000.ply); choose another "
                    "folder or remove them");
  const Session run = restore(o);
  SampleWriter* writer = run.family->sample_writer();
  if (!writer)
    throw UserError("model '" + run.config.model.name + "' is not a generative model: it has no "
                    "samples to draw (`tessera sample` takes a snapshot of a generative model)");
  if (run.comm->rank() == 0) fs::create_directories(o.out);
  o.sample.out_dir = o.out;
  const std::string line = writer->write_samples(o.sample);
  if (run.comm->rank() == 0) std::cerr << line << "\n";
  return kExitOk;
}

constexpr const char* kSnapshotHelp =
    "A snapshot (RUN_DIR/snapshots/step-*.h5), or a run folder (RUN_DIR or its snapshots/): its "
    "newest snapshot that validates";

void add_common(CLI::App* sub, SnapshotCommandOptions& o) {
  auto* snapshot =
      sub->add_option("snapshot", o.snapshot, kSnapshotHelp)->check(CLI::ExistingPath);
  auto* ply = sub->add_option("--ply", o.ply,
                              "Instead of a snapshot: a model trained by any tool, e.g. the 3DGS "
                              "Gaussians of an INRIA-layout .ply (in the capture's coordinates, as "
                              "`tessera export` writes them), rendered on the cameras of --scene")
                  ->type_name("FILE")
                  ->check(CLI::ExistingFile)
                  ->excludes(snapshot);
  sub->add_option("--scene", o.scene, "With --ply: the tessera-scene dataset whose cameras and "
                                       "images to use")
      ->type_name("FILE.h5")
      ->check(CLI::ExistingFile)
      ->needs(ply);
  sub->add_option("--set", o.overrides,
                  "Override a config key: of the snapshot's stored config (e.g. --set "
                  "data.path=FILE when the dataset moved), or with --ply of the model's default "
                  "config (e.g. --set gaussians.resolution_scale=2). Repeatable")
      ->type_name("KEY=VALUE");
  sub->add_option("--max-views", o.max_views, "Use at most this many views (default: all)")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto o = std::make_shared<SnapshotCommandOptions>();
  CLI::App* sub = app.add_subcommand(
      "eval", "Score a snapshot (or, with --ply, a model trained elsewhere): PSNR and SSIM per "
              "split as one JSON object (run under mpirun to split the rendering across ranks)");
  add_common(sub, *o);
  sub->add_option("--split", o->split, "Split to score (default: val and test, those that exist)")
      ->check(CLI::IsMember({"train", "val", "test"}));
  return {sub, [o] { return run_eval(*o); }};
}

Command add_render_command(CLI::App& app) {
  auto o = std::make_shared<SnapshotCommandOptions>();
  CLI::App* sub = app.add_subcommand(
      "render", "Render a snapshot's views (or, with --ply, a model trained elsewhere): a split, "
                "or an orbit around the scene, to PNGs");
  add_common(sub, *o);
  sub->add_option("--out", o->out, "Folder for the PNGs (created)")->required();
  auto* split = sub->add_option("--split", o->split, "Split whose views to render (default: test)")
                    ->check(CLI::IsMember({"train", "val", "test"}));
  sub->add_option("--orbit", o->orbit,
                  "Render N views on a circle around the scene instead of a split")
      ->check(CLI::PositiveNumber)
      ->excludes(split);
  return {sub, [o] { return run_render(*o); }};
}

Command add_sample_command(CLI::App& app) {
  auto o = std::make_shared<SnapshotCommandOptions>();
  CLI::App* sub = app.add_subcommand(
      "sample", "Draw samples from a generative model's snapshot (point-diffusion): one PLY point "
                "cloud per sample, DIR/sample-NNNN.ply (run under mpirun to split the samples "
                "across ranks; the samples do not depend on the number of ranks)");
  sub->add_option("snapshot", o->snapshot, kSnapshotHelp)->required()->check(CLI::ExistingPath);
  sub->add_option("--out", o->out, "Folder for the PLY files (created; must not hold samples)")
      ->required();
  o->sample.count = 16;
  sub->add_option("--count", o->sample.count, "Samples to draw")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("--steps", o->sample.steps,
                  "Denoising steps, evenly spaced over the model's noise levels (default: the "
                  "snapshot's diffusion.sample_steps)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--sampler", o->sample.sampler,
                  "ddpm (ancestral) or ddim (deterministic given the seed) (default: the "
                  "snapshot's diffusion.sampler)")
      ->check(CLI::IsMember({"ddpm", "ddim"}));
  sub->add_option("--seed", o->sample.seed, "Seed of the samples' noise: sample i depends on "
                                            "(seed, i) only")
      ->capture_default_str();
  sub->add_option("--set", o->overrides,
                  "Override a key of the snapshot's stored config (e.g. --set data.path=FILE when "
                  "the dataset moved). Repeatable")
      ->type_name("KEY=VALUE");
  return {sub, [o] { return run_sample(*o); }};
}

}  // namespace tessera::launch
