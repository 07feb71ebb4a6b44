// What `tessera eval` and `tessera render` do with a run restored from a snapshot or imported
// from a file (session.h), for every family: launch/ parses their flags and calls these.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "framework/session.h"

namespace tessera {

// The restored model's scores on `split` ("train", "val" or "test"), or with split "" on val and
// test, those the dataset has; at most `max_views` items each, spread over the split (-1: all).
// One JSON object:
// {"model", "ranks", "splits": {SPLIT: EvalScores::to_json()}}. UserError when the named split is
// empty, or without a split when the dataset has neither val nor test. Collective.
nlohmann::json evaluate_splits(const Session& run, const std::string& split, int64_t max_views);

struct RenderRequest {
  std::string out;        // folder for the PNGs (rank 0 creates it); "" = none (a video only)
  std::string video;      // an .mp4 of the frames in order (data/video.h); "" = none
  int fps = 0;            // the video's frames per second (0: the camera path's, else 30)
  // What is written per view into `out`: the colour (NAME.png), the expected depth in the
  // capture's units (NAME.depth.npy, float32, and NAME.depth.png, 16-bit scaled to the view's
  // largest depth) and the alpha (NAME.alpha.npy and NAME.alpha.png, 16-bit, 65535 = 1).
  bool rgb = true, depth = false, alpha = false;
  std::string split;      // "" = test; ignored with an orbit
  int orbit = 0;          // > 0: this many views on a circle around the scene (data/orbit.h)
  // A nerfstudio camera path's cameras instead (data/camera_path.h), views path-NNN; with the
  // nerfstudio run's dataparser_transforms.json when the poses are in its frame.
  std::string camera_path, dataparser_transforms;
  int64_t max_views = -1; // at most this many views, spread over them (-1: all)
};

// Renders the views `request` names with the family's ViewRenderer; rank 0 writes
// OUT/SPLIT-III.png (III the camera index) or OUT/orbit-NNN.png, and the video, with progress
// on stderr. Returns the number of images. UserError when the family renders no views (e.g. a
// shape-set model), the split has none, or a video's views differ in size. Collective.
int64_t render_views(const Session& run, const RenderRequest& request);

}  // namespace tessera
