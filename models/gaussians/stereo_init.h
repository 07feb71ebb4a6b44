// Starting points for 3DGS when a capture has no SfM points: plane-sweep stereo between each
// train view and a few neighbours, with the poses the capture already has (docs/gaussians.md,
// "Initialization"). Surfaces the views agree on get points coloured by the pixels; sky and
// textureless walls, where no match is unique, get none and are left to random_points.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "framework/data/scene.h"

namespace tessera::models::gaussians {

struct StereoOptions {
  int64_t points = 0;     // at most this many over all views, an even quota per view
  int64_t max_side = 512;  // images are matched at most this many pixels on their long side
  int sources = 4;         // neighbour views each reference view is matched against
  int depths = 64;         // coarse depth hypotheses per pixel (then 8 finer ones around the best)
  // A pixel's match is kept when the mean normalized cross-correlation of its 5x5 patch (3x3
  // samples, 2 pixels apart) with its two best-agreeing sources reaches this.
  double min_ncc = 0.7;
};

struct StereoPoints {
  torch::Tensor xyz;     // [P, 3] float32, world
  torch::Tensor rgb;     // [P, 3] float32 in [0, 1]
  int64_t candidates = 0;  // pixels matched (P of them kept)
  int64_t views = 0;       // reference views with at least two usable sources
};

// The sources of train view `views[i]` among `views`: up to `sources` others that look the same
// way (optical axes within 60 degrees) and see the point at the view's scene depth under a
// triangulation angle closest to 10 degrees (at least 1 degree). Indices into `views`.
std::vector<int64_t> stereo_sources(const std::vector<data::Camera>& cameras,
                                    const std::vector<int64_t>& views, size_t i,
                                    const std::array<double, 6>& bounds, int sources);

// Points of the reference views even_slice(views.size(), part, parts), in view order: each
// view's result depends on the scene and the options only, so concatenating the parts in rank
// order gives the same set at any world size.
// `progress(done, total)` is called before each of the part's views.
StereoPoints stereo_points(const data::SceneReader& scene, const std::vector<int64_t>& views,
                           const StereoOptions& options, int64_t part = 0, int64_t parts = 1,
                           const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace tessera::models::gaussians
