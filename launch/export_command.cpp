// `tessera export SNAPSHOT --ply OUT.ply`: the Gaussians of a 3DGS run's snapshot (written at any
// world size) as an INRIA .ply in canonical order, the file `tessera train` writes at the end.
#include <filesystem>
#include <iostream>
#include <memory>

#include "distributed/errors.h"
#include "launch/commands.h"
#include "models/gaussians/gaussian_trainer.h"
#include "models/gaussians/ply.h"

namespace tessera::launch {

namespace {

namespace gs = models::gaussians;

struct ExportOptions {
  std::string snapshot;
  std::string ply;
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
  const gs::GaussianParams params = gs::GaussianTrainer::read_snapshot_params(o.snapshot, &step);
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
  return {sub, [o] { return run_export(*o); }};
}

}  // namespace tessera::launch
