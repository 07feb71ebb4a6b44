// [gaussians]: the config section of the 3DGS family, bound to GaussianTrainerOptions.
#pragma once

#include "framework/config_schema.h"

namespace tessera::models::gaussians {

// The [gaussians] section for FamilyInfo::config_sections.
config_schema::SectionSpec gaussian_config_section();

// The framework keys a `gaussians` run does not read, refused when set (FamilyInfo::unused_keys).
std::vector<std::string> gaussian_unused_keys();

}  // namespace tessera::models::gaussians
