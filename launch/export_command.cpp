// `tessera export SNAPSHOT --ply OUT.ply`: the Gaussians of a 3DGS run's snapshot (written at any
// world size) as an INRIA .ply in canonical order, the file `tessera train` writes at the end.
#include <filesystem>
#include <iostream>
#include <memory>

#include "distributed/errors.h"
#include "framework/config.h"
#include "framework/data/scene.h"
#include "framework/snapshot.h"
#include "launch/commands.h"
#include "models/gaussians/gaussian_trainer.h"
#include "models/gaussians/ply.h"

namespace tessera::launch {

namespace {

namespace gs = models::gaussians;

struct ExportOptions {
  std::string snapshot;
  std::string ply;
  std::string scene;   // the run's dataset ("" = the path in the snapshot's config)
  bool world = false;  // keep the dataset's normalized world coordinates
};

int run_export(const ExportOptions& o) {
  // One process does the work; under mpirun the other ranks have nothing to do.
  if (launcher_rank() != 0) return kExitOk;
  if (!std::filesystem::exists(o.snapshot))
    throw UserError(o.snapshot + ": no such file (a snapshot is RUN_DIR/snapshots/step-*.h5 of a "
                    "run with model.name = \"gaussians\")");
  int64_t step = 0;
  // Reads and verifies everything before the PLY is written (atomically), so a bad snapshot
  // leaves no file behind.
  gs::GaussianParams params = gs::GaussianTrainer::read_snapshot_params(o.snapshot, &step);
  if (!o.world) {  // back to the capture's coordinates, as the run's own gaussians.ply
    std::string scene = o.scene;
    if (scene.empty()) {
      const SnapshotReader reader(o.snapshot);
      scene = parse_config(reader.meta().config_toml, o.snapshot + " (stored config)", {}).data.path;
    }
    if (scene.empty() || !std::filesystem::exists(scene))
      throw UserError(o.snapshot + ": its dataset '" + scene + "' is not there, and the PLY is "
                      "written in the capture's coordinates that the dataset records: give it "
                      "with --scene FILE.h5, or pass --world for the training coordinates");
    const data::SceneReader reader(scene);
    params = gs::world_to_capture(params, reader.meta().capture_scale, reader.meta().capture_offset);
  }
  gs::write_ply(o.ply, params);
  std::cerr << "wrote " << params.size() << " Gaussians (step " << step << ") to " << o.ply
            << "\n";
  return kExitOk;
}

}  // namespace

Command add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* sub = app.add_subcommand(
      "export", "Write the Gaussians of a 3DGS snapshot (model.name = \"gaussians\", any world "
                "size) as an INRIA .ply for the standard viewers; runs without mpirun");
  sub->add_option("snapshot", o->snapshot,
                  "A snapshot of a Gaussian run (RUN_DIR/snapshots/step-NNNNNNNN.h5)")
      ->required();
  sub->add_option("--ply", o->ply,
                  "The .ply file to write (binary, INRIA layout, ordered by Gaussian id; written "
                  "to a temporary name, then renamed)")
      ->required()
      ->type_name("OUT.ply");
  auto* scene = sub->add_option("--scene", o->scene,
                                "The run's dataset, whose recorded normalization takes the "
                                "Gaussians back to the capture's coordinates (default: the "
                                "data.path stored in the snapshot)")
                    ->type_name("FILE.h5");
  auto* world = sub->add_flag("--world", o->world,
                              "Write the dataset's normalized (training) coordinates instead of "
                              "the capture's own (docs/datasets.md, \"Scene normalization\")");
  world->excludes(scene);
  return {sub, [o] { return run_export(*o); }};
}

}  // namespace tessera::launch
