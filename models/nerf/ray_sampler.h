// The global ray batch of a NeRF step as a pure function of (seed, step, sampling schedule), its
// per-rank slice, and the pixel -> ray math of OpenCV cameras (docs/training_loop.md, invariant 1).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "framework/data/scene.h"
#include "models/nerf/ray_model.h"

namespace tessera::models::nerf {

// A stable 64-bit mix of (seed, index, purpose) for seeding generators; identical everywhere.
uint64_t hash_seed(uint64_t seed, uint64_t index, const char* purpose);

// Rays through pixel centers (x + 0.5, y + 0.5) of OpenCV cameras (x right, y down, z forward),
// or through (x + sx, y + sy) where `subpixel` [R, 2] float64 in [0, 1) is given. Lens distortion (k1, k2, p1, p2) is honored: each pixel's normalized coordinates are undistorted
// (data::undistort, framework/data/lens.h) before the direction is built; when no camera has
// distortion the pinhole path runs unchanged. Directions are unit length; computed in float64.
// x, y: [R] int64 pixel coordinates; camera: [R] int64 index into `cameras`.
void pixel_rays(const std::vector<data::Camera>& cameras, const torch::Tensor& camera,  // [R]
                const torch::Tensor& x, const torch::Tensor& y,                          // [R], [R]
                torch::Tensor* origins, torch::Tensor* directions,   // out: [R, 3], [R, 3] f32
                const torch::Tensor& subpixel = {});

struct RaySamplerOptions {
  int64_t rays_per_step = 4096;  // global batch size R, the same on every rank
  uint64_t seed = 0;
  // Datasets with alpha and unbounded ones (SceneMeta::unbounded: real captures, whose every ray
  // ends on something): each training ray gets its own random background color, a pure function
  // of (seed, step, ray id), given to the model ([R, 3]) and, with alpha, composited into its
  // target. Without alpha the target stays the photo, so any transparency left in the render
  // shows a wrong color: the model learns to make every ray opaque (instant-ngp does the same)
  // instead of fitting a fog over the dataset's background.
  bool random_background = false;
  // Each training ray passes through a random point of its pixel, a pure function of (seed,
  // step, ray id), instead of its center (instant-ngp does the same). A photo's pixel is the
  // light over its whole area: rays at the centers alone train the model on one point of it, at
  // the same points every epoch, so what lies between them (the positions a new view's rays
  // take) is never fitted. Eval and render keep the centers, the footprint's mean.
  bool pixel_jitter = false;
};

// One epoch of the sampling schedule: a random pool of ceil(rate * P) pixels, in shuffled order.
struct SamplingEpoch {
  int64_t index = 0;       // epoch number, from 0
  int64_t first_step = 0;  // its first step
  int64_t steps = 1;       // its length: max(1, floor(pool / R))
  double rate = 1.0;       // the sampling rate at first_step
  int64_t pool = 0;        // ceil(rate * P) pixels
};

// Holds every training pixel (all pixels of all train images, read once at construction as
// uint8) and serves batches. Pixel ids number the pixels image by image (train order), row-major.
class RaySampler {
 public:
  // `rate_at(step)` is the sampling schedule (fraction of the training pixels in an epoch's pool,
  // in (0, 1]); it must be a pure function of the step.
  RaySampler(const data::SceneReader& scene, RaySamplerOptions options,
             std::function<double(int64_t)> rate_at);

  int64_t num_pixels() const { return num_pixels_; }
  int64_t rays_per_step() const { return options_.rays_per_step; }
  const std::vector<size_t>& train_indices() const { return train_; }

  // The epoch holding `step`. Epochs are found by iterating the schedule from step 0 (cached).
  SamplingEpoch epoch_of(int64_t step);
  // Global pixel ids of step `step`: [R] int64, a pure function of (seed, step, schedule).
  torch::Tensor global_batch(int64_t step);
  // The slice [rank*R/size, (rank+1)*R/size) of the global batch.
  static std::pair<int64_t, int64_t> rank_slice(int64_t rays, int rank, int size);
  // Rays, targets and ray ids (index in the global batch) of `ids` = global_batch(step)[begin:end].
  // `step` >= 0 draws random backgrounds (when enabled and the data has alpha) and the sub-pixel
  // positions (when enabled); -1 does neither.
  RayBatch rays_for(const torch::Tensor& ids, int64_t first_ray_id, torch::Device device,
                    int64_t step = -1) const;
  // Rays of this rank for `step`: rays_for(global_batch(step)[slice], slice.first).
  RayBatch rank_batch(int64_t step, int rank, int size, torch::Device device);

 private:
  torch::Tensor pool_order(const SamplingEpoch& epoch);  // [pool] int64, cached per epoch

  RaySamplerOptions options_;
  std::function<double(int64_t)> rate_at_;
  std::vector<data::Camera> cameras_;    // train cameras, in train order
  std::vector<size_t> train_;            // dataset indices of the train cameras
  torch::Tensor offsets_;                // [C + 1] int64: first pixel id of each image
  torch::Tensor widths_;                 // [C] int64
  torch::Tensor rgb_;                    // [P, 3] uint8
  torch::Tensor alpha_;                  // [P] uint8, undefined without alpha
  bool unbounded_ = false;               // SceneMeta::unbounded()
  torch::Tensor background_;             // [3] float32
  double near_ = 0.0, far_ = 0.0;
  int64_t num_pixels_ = 0;

  std::mutex mutex_;
  std::vector<SamplingEpoch> epochs_;  // known epochs, in order
  int64_t cached_epoch_ = -1;
  torch::Tensor cached_order_;
};

}  // namespace tessera::models::nerf
