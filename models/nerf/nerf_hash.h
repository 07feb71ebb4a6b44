// nerf-hash: the instant-ngp NeRF (Müller et al. 2022): multiresolution hash encoding, a small
// density MLP, an SH-conditioned colour MLP, occupancy-grid ray marching and volume rendering.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/nerf/ray_model.h"
#include "kernels/hash_encoding.h"
#include "kernels/ray_march.h"
#include "models/nerf/nerf_common.h"
#include "models/nerf/occupancy_grid.h"
#include "models/nerf/proposal_sampler.h"

namespace tessera::models::nerf {

// Defaults are sized for CPU training of the 128x128 demo scene in minutes (docs/nerf.md).
struct NerfHashOptions {
  // Hash grid. instant-ngp uses L=16, log2 T=19, N_max=2048 for 800 px scenes. N_max follows the
  // images (finest_resolution = 0): the finest cell is 2/3 of a pixel's footprint at the
  // foreground center (ModelContext::pixel_footprint); much finer cells are crossed by single
  // training rays and memorize them (docs/nerf.md, "Generalizing to new views"). On the 128 px
  // demo that is 152, and 12 levels from 16 keep b ~ 1.22, near instant-ngp's ~1.38-1.5 spacing.
  int levels = 12;
  int features_per_level = 2;   // F = 2: instant-ngp's best quality/speed trade-off
  // 0 = from the images: see NerfHash::auto_log2_hashmap_size.
  int log2_hashmap_size = 15;   // T = 32768 rows: 12*32768*2 = 786k parameters (3 MiB); levels
                                // past ~31^3 vertices hash, collisions are resolved by the MLP
  int base_resolution = 16;     // N_min of instant-ngp
  int finest_resolution = 0;    // N_max; 0 = from the images (see above)
  float embedding_init = 1e-4f; // table ~ U(-1e-4, 1e-4), as instant-ngp
  // MLPs (instant-ngp's sizes): density 1 hidden layer of 64 -> 16 features (the first is the
  // log-density); colour 2 hidden layers of 64 on [features, SH(direction)].
  int hidden_width = 64;
  int geo_features = 16;
  int color_hidden_layers = 2;
  // trunc_exp: sigma = exp(min(x, kMaxLogDensity)); exp(15) ~ 3.3e6 is already opaque over any
  // step, and the clamp keeps forward and backward finite.
  float max_log_density = 15.0f;
  // Marching: constant step = box diagonal / 256 (instant-ngp's bounded-scene default), cone 0.
  int steps_per_diagonal = 256;
  // mip-NeRF 360's distortion loss (distortion_loss in nerf_common.h), weighted per ray against
  // the photometric loss; 0 = off. Distances are s(t) = t for t <= 1 and 2 - 1/t beyond, halved
  // to [0, 1), with t from the camera in marching units (the foreground half-width is 1 when
  // unbounded): linear near the camera and like disparity far away, as mip-NeRF 360 does.
  float distortion_weight = 0.0f;
  // "Floaters No More" (Philip and Deschaintre 2023): the gradients of each sample's density and
  // colour are scaled by min(1, (t / near_gradient_distance)^2), t its distance from the camera
  // in the frame of an unbounded scene (cameras in [-1, 1]^3); the forward pass is unchanged.
  // Near a camera a unit of volume is covered by ~1/t^2 more of that camera's rays, so unscaled
  // it learns ~1/t^2 faster than the scene and the model paints each view on density just in
  // front of its camera: floaters that other views see as fog. 0 = off. The default 1 is about
  // a camera's distance to the scene. Unbounded scenes only: bounded ones (synthetic, masked
  // objects) have a near plane close to their content and no frame to measure t in.
  float near_gradient_distance = 1.0f;
  // Coarse to fine: the hash grid's levels are switched on one after another over this fraction
  // of the run's planned steps, from the coarsest third (weights ramp linearly, as in BARF and
  // Neuralangelo; the levels still off encode zeros). A scene's shape settles on the coarse
  // levels before the fine ones could fit each training ray on its own; 0 = every level from the
  // start. The renders at a step depend on (step, planned steps) only, so ranks and resumed runs
  // agree. Measured in docs/nerf.md, "Generalizing to new views".
  float coarse_to_fine = 0.0f;
  // Zip-NeRF's normalized weight decay: weight_decay * sum over levels of the mean squared feature
  // of the level's table, once per step (each micro-batch adds its share of the global batch's
  // rays). Adam normalizes gradients per row, so a row whose only gradient is the decay steps
  // toward zero at the learning rate, while rows the photos support hardly feel it: what survives
  // is what many rays agree on. 0 = off.
  float weight_decay = 0.0f;
  // The occupancy threshold (grid.threshold, instant-ngp's NERF_MIN_OPTICAL_THICKNESS) applies to
  // sigma times instant-ngp's step, diagonal / 1024 (its NERF_STEPS), whatever step is marched:
  // with the marching step instead, every cell of an untrained model (sigma ~ 1) would stay
  // occupied 4x longer, and a real capture's rays would sample all of empty space for hundreds
  // of steps.
  int grid_reference_steps = 1024;
  int64_t max_samples_per_ray = 1024;
  // Training rays start marching a random fraction of their first step past where they would
  // (instant-ngp's random start; nerf-mlp's stratified samples): the samples, and every sample
  // behind them, move by up to one step, a pure function of (seed, step, ray id). Without it a
  // ray's samples sit at the same depths every epoch, and the model need only be right there.
  // Eval and render start at the same place as without.
  bool march_jitter = false;
  // Unbounded scenes (ModelContext::unbounded: real captures whose backgrounds lie beyond the
  // foreground box): space is contracted (mip-NeRF 360, L-inf as nerfacto) so the hash grid and
  // the occupancy grid cover everything out to infinity in [-2, 2]^3, and steps grow with the
  // distance (cone tracing): dt = max(step, t * cone_angle). instant-ngp uses 1/256 for large
  // scenes; 1/128 halves the far-field samples on CPU for a step that still stays below the
  // contracted grid's cell size out to ~10 foreground radii.
  float unbounded_cone_angle = 1.0f / 128.0f;
  // Occupancy grid, refreshed every `grid_update_interval` steps (instant-ngp: 16).
  OccupancyGridOptions grid{};
  int64_t grid_update_interval = 16;
  // Where a ray's samples come from: "grid" marches the occupancy grid (instant-ngp, the steps
  // above); "proposal" draws them from two small proposal density fields (nerfacto,
  // proposal_sampler.h), and the occupancy grid is neither used nor updated.
  std::string sampler = "grid";
  ProposalOptions proposal{};
};

class NerfHash : public Model {
 public:
  NerfHash(const NerfHashOptions& options, const ModelContext& context, uint64_t seed);

  std::string name() const override { return "nerf-hash"; }
  std::vector<ParamGroup> parameter_groups() override;
  RenderResult render(const RayBatch& rays, const StepContext& context) override;
  void after_step(const StepContext& context, distributed::Communicator& comm) override;
  void set_total_steps(int64_t steps) override { total_steps_ = steps; }
  std::vector<std::string> segment_names() const override { return {"density_mlp", "color_mlp"}; }
  void set_checkpointed_segments(const std::vector<std::string>& names) override;
  // density_mlp and color_mlp measured on the samples that marching `rays` through the current
  // occupancy grid gives (at step 0 the grid is all occupied: the most samples training sees).
  std::vector<SegmentInfo> measure_segments(const RayBatch& rays, const StepContext& context) override;
  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override;

  OccupancyGrid& occupancy_grid() { return grid_; }
  // Off: render() composites every marched sample, also those behind where a ray's transmittance
  // ends (docs/nerf.md, nerf-hash step 5). For tests and benchmarks: the result is the same.
  void set_skip_occluded(bool on) { skip_occluded_ = on; }
  // The occlusion pass evaluates each ray's samples front to back in rounds, the first of
  // `first` samples a ray and each next one twice the last, until every ray has ended; 0
  // evaluates every marched sample in one round. The kept samples are the same either way. For
  // tests and benchmarks.
  void set_occlusion_chunk(int64_t first) { occlusion_chunk_ = first; }
  float step_size() const { return step_size_; }
  // Marches `rays` through the occupancy grid (in marching space): the samples render() starts
  // from. With `context` in training and march_jitter, each ray starts a random fraction of its
  // first step later (NerfHashOptions::march_jitter).
  kernels::RayMarchOutput march(const RayBatch& rays, const StepContext* context = nullptr) const;
  // With sampler = "proposal": the proposal sampler's samples of `rays` (in marching space), over
  // the span marching would cover; with `context` in training, jittered by (seed, step, ray id).
  ProposalSamples propose(const RayBatch& rays, const StepContext* context = nullptr) const;
  bool contracted() const { return contract_; }
  // World units per frame unit: the uncontracted frame [-1, 1]^3 spans the foreground box and the
  // cameras (unbounded scenes); 1 for bounded ones.
  float frame_half_width() const { return 1.0f / frame_scale_; }
  // N_max in use: the configured one, or the one chosen from the images.
  int finest_resolution() const { return options_.finest_resolution; }
  int log2_hashmap_size() const { return options_.log2_hashmap_size; }
  // sigma at world positions [M, 3] (differentiable).
  torch::Tensor density(const torch::Tensor& positions);
  // sigma at positions in the occupancy grid's space [M, 3]: world (bounded scenes) or the
  // contracted space [-2, 2]^3 (unbounded); what the grid update evaluates.
  torch::Tensor grid_density(const torch::Tensor& grid_positions);

 private:
  // Marching space: world for bounded scenes; for unbounded ones the frame in which the
  // foreground box is [-1, 1]^3 (p' = (p - center) * frame_scale_).
  torch::Tensor to_frame(const torch::Tensor& world) const;
  // Marching space -> the hash grid's [0, 1]^3 (through the contraction when unbounded).
  torch::Tensor normalize(const torch::Tensor& positions) const;
  // Where rays (marching space) enter and leave the clip box [R] each: where marching starts and
  // stops (kernels/ray_march.h, rules 2 and 3). A ray that misses the box leaves before it
  // enters (an axis it runs along, outside the box's slab: leaves at -inf).
  std::pair<torch::Tensor, torch::Tensor> clip_span(const torch::Tensor& origins,
                                                    const torch::Tensor& directions) const;
  // The rays' near and far planes in marching units [R] each.
  std::pair<torch::Tensor, torch::Tensor> near_far(const RayBatch& rays) const;

  std::vector<torch::Tensor> density_mlp(const std::vector<torch::Tensor>& in) const;
  // The occlusion pass (no gradient): how many of each ray's marched samples volume_render
  // composites before its transmittance ends [R]; `local` [marched] is each sample's index within
  // its ray. With `features_out`, the density MLP's features of the samples evaluated
  // [marched, geo_features] (the kept ones always are).
  torch::Tensor occlusion_counts(const kernels::RayMarchOutput& march, const torch::Tensor& local,
                                 torch::Tensor* features_out) const;
  std::vector<torch::Tensor> color_mlp(const std::vector<torch::Tensor>& in) const;
  // N_max from the images: the grid's side (world units) over ModelContext::pixel_footprint,
  // within [base_resolution, kMaxFinestResolution]; kFallbackFinestResolution without cameras.
  int auto_finest_resolution() const;
  // T from the images: the largest power of two with at least kPixelsPerRow training pixels
  // (ModelContext::train_pixels) per row, within [2^kMinAutoLog2Size, 2^kMaxAutoLog2Size]; 2^15
  // without cameras.
  int auto_log2_hashmap_size() const;
  // The hash encoding of points in the grid's [0, 1]^3, times the coarse-to-fine level weights.
  torch::Tensor encode(const torch::Tensor& unit) const;
  // The level weights at `step` of total_steps_ (undefined when every level is fully on); kept
  // until the step or the plan changes. render() and after_step() set them, and density() and
  // grid_density() encode with the weights of the step last set.
  void set_step(int64_t step);
  torch::Tensor level_weights_;  // [L * F] float32 on the model's device, or undefined
  int64_t total_steps_ = 0;
  int64_t weights_step_ = -1, weights_total_steps_ = -1;  // what level_weights_ was built for
  // Finest cells per pixel footprint. Measured: at 1 a 70-view 302x403 capture lost 1.1 dB
  // against 1.3, at ~5 a 36-view 96x96 scene fitted each training ray on cells of its own
  // (docs/nerf.md, "Generalizing to new views"); 1.5 is within both.
  static constexpr double kCellsPerPixelFootprint = 1.5;
  static constexpr int kMaxFinestResolution = 1 << 16;
  static constexpr int kFallbackFinestResolution = 256;
  // Training pixels per table row and level, at least. A surface point of a capture is seen by
  // ~10 of its views, so with T <= pixels / 10 a fine level's row is constrained by about as many
  // rays as one point has views; with many more rows than that, rows are fitted by single rays. Measured
  // (docs/nerf.md, "Hash-grid weight decay and the far colour"): a 332k-pixel scene generalized
  // best at 2^15 (2^13 and 2^17 worse), an 8.5M-pixel capture lost 2.6 dB at 2^15 against 2^17.
  // The upper bound is the CPU's: at 2^19 (instant-ngp's size) that capture trained at 3.6k rays/s
  // instead of 6.7k, half the steps in its 15 minutes, and lost 1.2 dB against 2^17. On a GPU a
  // larger table may pay; set nerf.hash_log2_size.
  static constexpr double kPixelsPerRow = 10.0;
  static constexpr int kMinAutoLog2Size = 14;
  static constexpr int kMaxAutoLog2Size = 17;
  static constexpr int kFallbackLog2Size = 15;

  NerfHashOptions options_;
  ModelContext context_;
  kernels::HashEncodingConfig encoding_;
  torch::Tensor embeddings_;  // [L, T, F]
  std::vector<DenseLayer> density_layers_;
  std::vector<DenseLayer> color_layers_;
  OccupancyGrid grid_;
  std::unique_ptr<ProposalSampler> proposal_;  // sampler = "proposal" only
  float step_size_ = 0.0f;
  bool contract_ = false;
  std::array<float, 3> frame_center_{0, 0, 0};
  float frame_scale_ = 1.0f;
  torch::Tensor clip_box_;  // [6] float32 on the CPU: the rays' box in marching space
  bool skip_occluded_ = true;
  // Samples a ray in the occlusion pass's first round. Rays render ~30 samples of ~100 marched
  // once the grid has pruned (docs/nerf.md, nerf-hash step 5): 32 ends most rays in one or two
  // rounds without evaluating the samples behind their surface.
  int64_t occlusion_chunk_ = 32;
  bool checkpoint_density_ = false;
  bool checkpoint_color_ = false;
};

std::unique_ptr<Model> make_nerf_hash(const Config& config, const ModelContext& context);

}  // namespace tessera::models::nerf
