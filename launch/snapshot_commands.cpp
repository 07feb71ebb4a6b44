// `tessera eval SNAPSHOT` (the family's scores per split, one JSON object), `tessera render
// SNAPSHOT --out DIR` (PNGs of a split's views or of an orbit) and `tessera sample SNAPSHOT
// --out DIR` (a generative family's samples), for every model family, on any number of ranks.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "distributed/errors.h"
#include "framework/data/video.h"
#include "framework/session.h"
#include "framework/session_tasks.h"
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
  std::string video;  // render: an .mp4 of the frames
  int fps = 0;        // render: 0 = the camera path's, else 30
  std::string camera_path, dataparser_transforms;  // render: a nerfstudio camera path
  std::vector<std::string> outputs{"rgb"};  // render: what is written per view
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
  nlohmann::json result = evaluate_splits(run, o.split, o.max_views);
  if (o.ply.empty()) {
    result["snapshot"] = o.snapshot;
    result["step"] = run.step;
  } else {
    result["ply"] = o.ply;
    result["scene"] = o.scene;
  }
  if (run.comm->rank() == 0) std::cout << result.dump() << std::endl;
  return kExitOk;
}

int run_render(SnapshotCommandOptions& o) {
  // Before MPI: bad input is refused once, with exit code 2.
  if (o.out.empty() && o.video.empty()) throw UserError("give --out DIR (PNGs), --video FILE.mp4, or both");
  auto wants = [&](const char* output) {
    return std::find(o.outputs.begin(), o.outputs.end(), output) != o.outputs.end();
  };
  if (o.out.empty() && (wants("depth") || wants("alpha")))
    throw UserError("--outputs depth and alpha are written into --out DIR; give --out");
  if (!o.video.empty()) {
    data::check_video_path(o.video);
    data::find_ffmpeg();
  }
  const Session run = restore(o);
  RenderRequest request;
  request.out = o.out;
  request.video = o.video;
  request.fps = o.fps;
  request.rgb = wants("rgb");
  request.depth = wants("depth");
  request.alpha = wants("alpha");
  request.split = o.split;
  request.orbit = o.orbit;
  request.camera_path = o.camera_path;
  request.dataparser_transforms = o.dataparser_transforms;
  request.max_views = o.max_views;
  render_views(run, request);
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
  sub->add_option("--max-views", o.max_views,
                  "At most this many views (eval: of each split), spread evenly over them as "
                  "a run's eval picks them, not the first ones (default: all)")
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
                "or an orbit around the scene, to PNGs and/or an MP4 video");
  add_common(sub, *o);
  sub->add_option("--out", o->out, "Folder for the PNGs (created); needed unless --video is given");
  auto* video = sub->add_option("--video", o->video,
                  "Also (or only) an H.264 video of the frames in order, e.g. --orbit 120 --video "
                  "orbit.mp4: encoded by ffmpeg (Debian's), written whole or not at all")
      ->type_name("FILE.mp4");
  sub->add_option("--fps", o->fps,
                  "Frames per second of --video (default: the --camera-path's fps, else 30)")
      ->check(CLI::Range(1, 240))
      ->needs(video);
  sub->add_option("--outputs", o->outputs,
                  "What to write per view into --out, comma-separated: rgb (NAME.png), depth (the "
                  "expected depth along the optical axis in the capture's units, as "
                  "NAME.depth.npy float32 and a 16-bit NAME.depth.png scaled to the view's largest "
                  "depth, kept in its depth_max text chunk), alpha (accumulated opacity, "
                  "NAME.alpha.npy and a 16-bit NAME.alpha.png). Default: rgb")
      ->delimiter(',')
      ->check(CLI::IsMember({"rgb", "depth", "alpha"}));
  auto* split = sub->add_option("--split", o->split, "Split whose views to render (default: test)")
                    ->check(CLI::IsMember({"train", "val", "test"}));
  auto* orbit = sub->add_option("--orbit", o->orbit,
                  "Render N views on a circle around the scene instead of a split")
      ->check(CLI::PositiveNumber)
      ->excludes(split);
  auto* path = sub->add_option("--camera-path", o->camera_path,
                  "Render the cameras of a nerfstudio camera path (camera_path.json, as the "
                  "nerfstudio viewer exports it) instead of a split: poses in the capture's "
                  "coordinates (its transforms.json's), or in a nerfstudio run's with "
                  "--dataparser-transforms; perspective cameras, render_width x render_height")
      ->check(CLI::ExistingFile)
      ->excludes(split)
      ->excludes(orbit)
      ->type_name("FILE.json");
  sub->add_option("--dataparser-transforms", o->dataparser_transforms,
                  "With --camera-path: the dataparser_transforms.json of the nerfstudio run the "
                  "path was made in (its scale and transform are undone)")
      ->check(CLI::ExistingFile)
      ->needs(path)
      ->type_name("FILE.json");
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
