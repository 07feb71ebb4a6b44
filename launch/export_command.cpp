// `tessera export SNAPSHOT --ply OUT.ply`: what a snapshot's model family exports (a 3DGS run: its
// Gaussians as an INRIA PLY, written at any world size), without MPI.
#include <filesystem>
#include <iostream>

#include "distributed/errors.h"
#include "framework/family.h"
#include "framework/session.h"
#include "framework/snapshot.h"
#include "launch/commands.h"
#include "models/builtin.h"

namespace tessera::launch {

namespace {

int run_export(ExportRequest& o) {
  // One process does the work; under mpirun the other ranks have nothing to do.
  if (launcher_rank() != 0) return kExitOk;
  if (!std::filesystem::exists(o.snapshot))
    throw UserError(o.snapshot + ": no such file or folder (a snapshot is "
                    "RUN_DIR/snapshots/step-*.h5; a run folder gives its newest)");
  o.snapshot = snapshot_argument(o.snapshot);
  FamilyRegistry families;
  models::register_builtin_families(families);
  std::string model;
  {
    const SnapshotReader reader(o.snapshot);
    model = reader.meta().model;
  }
  const FamilyInfo* family = families.contains(model) ? &families.get(model, o.snapshot) : nullptr;
  if (family == nullptr || !family->export_snapshot) {
    std::string exporting;
    for (const std::string& name : families.names())
      if (families.get(name, o.snapshot).export_snapshot)
        exporting += (exporting.empty() ? "" : ", ") + name;
    throw UserError(o.snapshot + ": a snapshot of model '" + model + "', which has nothing to "
                    "export (models that export: " + exporting + ")");
  }
  std::cerr << family->export_snapshot(o) << "\n";
  return kExitOk;
}

}  // namespace

Command add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportRequest>();
  CLI::App* sub = app.add_subcommand(
      "export", "Write what a snapshot's model exports (a 3DGS run, model.name = \"gaussians\": "
                "its Gaussians as an INRIA .ply for the standard viewers; any world size); runs "
                "without mpirun");
  sub->add_option("snapshot", o->snapshot,
                  "A snapshot of a run (RUN_DIR/snapshots/step-NNNNNNNN.h5), or a run folder "
                  "(RUN_DIR or its snapshots/): its newest snapshot that validates")
      ->required();
  sub->add_option("--ply", o->out,
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
