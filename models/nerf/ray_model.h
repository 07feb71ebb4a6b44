// The ray Model interface that the RayTrainer drives, and the registry that builds a ray model by
// its config name. nerf-hash and nerf-mlp implement it; nerf_family.cpp registers them.
#pragma once

#include <torch/types.h>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "framework/checkpoint_policy.h"
#include "framework/config.h"
#include "framework/param_group.h"
#include "framework/phase_timer.h"
#include "framework/data/scene.h"

namespace tessera::models::nerf {

// A batch of rays in world space (OpenCV cameras, docs/datasets.md). All tensors on the model's device.
struct RayBatch {
  torch::Tensor origins;     // [R, 3] float32
  torch::Tensor directions;  // [R, 3] float32, unit length
  torch::Tensor near;        // [R] float32, ray start distance
  torch::Tensor far;         // [R] float32, ray end distance
  torch::Tensor target_rgb;  // [R, 3] float32 in [0, 1], composited over `background`; undefined
                             // when rendering without a target
  torch::Tensor background;  // [3] float32 in [0, 1], or [R, 3] per ray (random backgrounds)
  // Unbounded scenes in eval and render (RayTrainer): every ray of a capture ends on something, so
  // the transmittance a ray has left after its last sample takes that sample's colour (nerfacto's
  // "last_sample" background), not `background`: a val ray that slips between the far shell's
  // density shows the far colour around it, not the dataset's white. Rays without a sample keep
  // `background`. Models that do not contract space ignore it.
  bool last_sample_background = false;
  torch::Tensor ray_ids;     // [R] int64: each ray's index in the step's global batch (seeds
                             // per-ray randomness such as sample jitter)
};

// Rays [begin, begin + count) of `rays`: every per-ray tensor narrowed (views, no copies), a
// shared [3] background and undefined tensors kept as they are.
RayBatch narrow_rays(const RayBatch& rays, int64_t begin, int64_t count);

// What a model renders for a RayBatch. `rgb` is already composited over the batch's background.
struct RenderResult {
  torch::Tensor rgb;      // [R, 3]
  torch::Tensor opacity;  // [R]
  torch::Tensor depth;    // [R]
  int64_t samples = 0;    // samples marched and evaluated (for statistics)
  // Of those, the samples fully rendered (colour, and gradients in training); -1: all of them.
  // nerf-hash leaves out the samples behind where a ray's transmittance ends.
  int64_t samples_rendered = -1;
  // A regularization term of the model (undefined: none), summed over the batch's rays; training
  // adds it to the loss divided by the step's global ray count, so it is a per-ray mean like the
  // photometric loss. Not part of the reported loss or PSNR.
  torch::Tensor regularization;
};

// Where in training a call happens. Any randomness a model draws must be a pure function of
// (seed, step) and of the ray's identity, never of the rank or of the batch split, so that N ranks
// train exactly like one (docs/training_loop.md, invariant 1).
struct StepContext {
  int64_t step = 0;
  uint64_t seed = 0;
  bool training = true;
  // The step's phase timer (training): render laps "march", "encode", "mlp" and "composite" on it
  // as it goes; null when nothing is timed.
  PhaseTimer* phases = nullptr;
};

// Charges `phase` on the step's timer, when there is one.
inline void lap(const StepContext& context, const std::string& phase) {
  if (context.phases != nullptr) context.phases->lap(phase);
}

// What a factory gets besides the config: the scene's geometry and the device.
struct ModelContext {
  std::array<double, 6> scene_bounds{};  // xmin, ymin, zmin, xmax, ymax, zmax: the foreground
  // Everything the cameras see; beyond scene_bounds on some side for unbounded real captures
  // (data::SceneMeta::scene_extent). All zero = scene_bounds.
  std::array<double, 6> scene_extent{};
  // The box of the camera centers (all splits), xmin..zmax; all zero = unknown (a context built
  // in code). Unbounded nerf-hash leaves the space around the cameras uncontracted.
  std::array<double, 6> camera_bounds{};
  double near = 0.0;
  double far = 0.0;
  // World units one pixel spans at the foreground box's center: the median over the cameras of
  // (distance from the camera to that center) / (focal length in pixels). 0 = unknown (a context
  // built in code). What the images can resolve there, which sizes nerf-hash's finest level.
  double pixel_footprint = 0.0;
  // Pixels of the train split's views (0 = unknown, a context built in code): how many rays
  // constrain the model, which sizes nerf-hash's table when nerf.hash_log2_size = 0.
  int64_t train_pixels = 0;
  torch::Device device = torch::kCPU;

  // The scene's geometry from a dataset's root attributes and cameras.
  static ModelContext from_scene(const data::SceneReader& scene, torch::Device device);
  // scene_extent reaches beyond scene_bounds on some side.
  bool unbounded() const;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  // Every trainable tensor, in a fixed order identical on every rank.
  virtual std::vector<ParamGroup> parameter_groups() = 0;
  // Renders `rays`; differentiable with respect to the parameters when autograd is on.
  virtual RenderResult render(const RayBatch& rays, const StepContext& context) = 0;
  // Called on every rank after each optimizer step, in step order. Collective when the model keeps
  // state agreed across ranks (the NeRF occupancy grid): every rank must call it.
  virtual void after_step(const StepContext& context, distributed::Communicator& comm) {}
  // The steps of the run's current plan (RayTrainer::set_total_steps; again at every re-plan of a
  // time budget): a model with a schedule of its own over the run (nerf-hash's coarse-to-fine
  // levels) rescales it, as the learning rate is. Its renders stay a function of the step.
  virtual void set_total_steps(int64_t steps) {}
  // Names of the segments that activation checkpointing may recompute, in forward order.
  virtual std::vector<std::string> segment_names() const { return {}; }
  // Segments to checkpoint from now on (a subset of segment_names()).
  virtual void set_checkpointed_segments(const std::vector<std::string>& names) {}
  // A dry run on `rays` that measures each segment with measure_segment() (checkpoint_policy.h):
  // one SegmentInfo per segment_names() entry, in that order, for the "budget" policy. Nothing
  // is kept and no parameter gradient is touched. Empty when the model cannot measure itself.
  // Throws std::runtime_error when the device's memory cannot be measured.
  virtual std::vector<SegmentInfo> measure_segments(const RayBatch& rays, const StepContext& context) {
    return {};
  }
  // Non-parameter state that must be saved and restored exactly (e.g. the occupancy grid).
  virtual std::vector<std::pair<std::string, torch::Tensor>> state_tensors() { return {}; }
};

using ModelFactory = std::function<std::unique_ptr<Model>(const Config&, const ModelContext&)>;

// Models by name. An unknown name throws UserError listing the known ones.
class ModelRegistry {
 public:
  void add(const std::string& name, ModelFactory factory);
  std::unique_ptr<Model> create(const Config& config, const ModelContext& context) const;
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  // Throws UserError naming `origin` and listing the known models unless `name` is registered.
  void require(const std::string& name, const std::string& origin) const;

 private:
  std::vector<std::pair<std::string, ModelFactory>> factories_;
};

}  // namespace tessera::models::nerf
