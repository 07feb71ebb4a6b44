// `tessera info FILE`: a readable summary of a Tessera file, for every family.
#pragma once

#include <ostream>
#include <string>

#include "framework/family.h"

namespace tessera {

// Writes to `out` what `path` holds: a dataset (what its reader describes: a scene's cameras,
// sizes, bounds and points; a shape set's shapes and kinds) or a snapshot (step, model, what its
// family in `families` describes, world size, parameters, checksums, config); of a run folder
// (RUN_DIR or its snapshots/), its newest snapshot that validates. UserError for a file that is
// not a Tessera file, and, after its description, for a damaged snapshot.
void describe_file(const std::string& path, const FamilyRegistry& families, std::ostream& out);

}  // namespace tessera
