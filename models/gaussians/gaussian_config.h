// [gaussians]: the config section of the 3DGS family, bound to GaussianTrainerOptions.
#pragma once

#include "framework/config_schema.h"

namespace tessera::models::gaussians {

// The [gaussians] section for FamilyInfo::config_sections.
config_schema::SectionSpec gaussian_config_section();

// The opt-in framework keys a `gaussians` run reads; the others are refused when set
// (FamilyInfo::shared_keys).
std::vector<std::string> gaussian_shared_keys();

}  // namespace tessera::models::gaussians
