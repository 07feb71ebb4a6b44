// A nerfstudio camera path (the viewer's "Export path", `ns-render camera-path`'s input) as
// cameras in a Tessera dataset's world, for `tessera render --camera-path` (docs/formats.md,
// "Camera paths").
#pragma once

#include <string>
#include <vector>

#include "framework/data/scene.h"

namespace tessera::data {

struct CameraPath {
  std::vector<Camera> cameras;  // OpenCV camera-to-world in the dataset's world, pinhole
  double fps = 0;               // the file's "fps" (0: none given)
};

// Reads `path`: render_width, render_height and camera_path[] of {camera_to_world: 16 numbers,
// row-major, OpenGL axes; fov: vertical, degrees}, with an optional camera_type that must be
// "perspective". The poses are in the capture's coordinates (those of its transforms.json), or,
// when `dataparser_transforms` names nerfstudio's dataparser_transforms.json of the run the path
// was made in, in that run's normalized frame (model = scale * (transform * capture)), which is
// undone first. `meta`'s normalization then takes them into the dataset's world. Throws
// UserError naming the file and the entry for anything else.
CameraPath read_camera_path(const std::string& path, const SceneMeta& meta,
                            const std::string& dataparser_transforms = "");

}  // namespace tessera::data
