// Camera paths around a scene that are not in its dataset: what `tessera render --orbit N` draws.
#pragma once

#include <vector>

#include "framework/data/scene.h"

namespace tessera::data {

// N cameras on a horizontal circle around the centre of the scene's box, at the mean horizontal
// distance of the dataset's cameras from it and at their mean height, looking at the centre,
// with camera 0's intrinsics and no lens distortion.
std::vector<Camera> orbit_cameras(const SceneReader& scene, int n);

}  // namespace tessera::data
