// `tessera info FILE.h5`: its flags; framework/file_info.h describes the file.
#include <iostream>
#include <memory>
#include <string>

#include "distributed/errors.h"
#include "framework/family.h"
#include "framework/file_info.h"
#include "launch/commands.h"
#include "models/builtin.h"

namespace tessera::launch {

Command add_info_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "info", "Print a summary of a Tessera file: a scene dataset (cameras per split, image "
              "sizes, intrinsics, bounds, near/far, alpha, points, size on disk), a shape set "
              "(shapes per split, points per shape, kinds) or a snapshot (step, model, world "
              "size, parameter counts, checksums, config)");
  sub->add_option("file", *path,
                  "The .h5 file to describe (a scene, a shape set or a snapshot), or a run folder "
                  "(RUN_DIR or its snapshots/): its newest snapshot that validates")
      ->required();
  return {sub, [path] {
            FamilyRegistry families;
            models::register_builtin_families(families);
            describe_file(*path, families, std::cout);
            return kExitOk;
          }};
}

}  // namespace tessera::launch
