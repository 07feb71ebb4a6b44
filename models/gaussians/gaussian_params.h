// The trainable tensors of a 3D Gaussian Splatting scene (stored before activation), their
// parameter groups and learning rates, and their initialization from points or at random.
#pragma once

#include <torch/optim.h>
#include <torch/types.h>

#include <array>
#include <optional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/data/scene.h"
#include "framework/even_slice.h"
#include "framework/param_group.h"
#include "kernels/pointwise.h"

namespace tessera::models::gaussians {

// Highest SH degree kept (INRIA's f_rest_0..44): 16 coefficients per channel.
constexpr int kMaxShDegree = 3;
constexpr int64_t kShCoeffs = (kMaxShDegree + 1) * (kMaxShDegree + 1);
// Y_0 of the real SH basis: a DC coefficient c gives colour C0 * c + 0.5.
constexpr double kShC0 = 0.28209479177387814;
// Opacity of a new Gaussian (INRIA and gsplat): faint enough that early views are not blocked.
constexpr double kInitOpacity = 0.1;
// Neighbours whose distances give the initial scale (INRIA's distCUDA2).
constexpr int kInitNeighbours = 3;
// Floor of the mean squared neighbour distance (INRIA clamps at 1e-7): duplicate points would
// otherwise get a zero scale, log(0) = -inf.
constexpr double kMinInitDist2 = 1e-7;

// The parameter groups, in their fixed order (also the order of fields() and of the optimizer).
constexpr std::array<const char*, 6> kGroupNames = {"means",     "scales", "quats",
                                                    "opacities", "sh_dc",  "sh_rest"};
// The trailing shape of each group's row (kGroupNames order): a row is one Gaussian, 59 floats.
inline const std::array<std::vector<int64_t>, 6> kGroupRowShapes = {
    std::vector<int64_t>{3}, {3}, {4}, {}, {1, 3}, {kShCoeffs - 1, 3}};

// All tensors are leaves that require grad, float32, on one device, with N rows.
struct GaussianParams {
  torch::Tensor means;           // [N, 3]     world-space centres
  torch::Tensor log_scales;      // [N, 3]     log of the standard deviations (activation: exp)
  torch::Tensor quats;           // [N, 4]     raw rotation (w, x, y, z), normalized in the kernel
  torch::Tensor opacity_logits;  // [N]        activation: sigmoid
  torch::Tensor sh_dc;           // [N, 1, 3]  SH coefficient 0 per channel
  torch::Tensor sh_rest;         // [N, 15, 3] SH coefficients 1..15 per channel

  int64_t size() const { return means.defined() ? means.size(0) : 0; }
  // [N, 3] and [N]: each Gaussian's value from its own row alone, at any place in the shard
  // (kernels/pointwise.h), so that a Gaussian renders the same bits on whichever rank owns it.
  torch::Tensor scales() const { return kernels::pointwise::exp(log_scales); }
  torch::Tensor opacities() const { return kernels::pointwise::sigmoid(opacity_logits); }
  // Pointers to the six tensors in kGroupNames order.
  std::array<torch::Tensor*, 6> fields();
  std::array<const torch::Tensor*, 6> fields() const;
  // One group per tensor, named and ordered as kGroupNames.
  std::vector<ParamGroup> parameter_groups() const;
  // Every tensor made a leaf that requires grad (detached copies keep their values).
  void make_leaves();
};

// Builds params from the six tensors (copied, detached, made float32 leaves that require grad).
// Throws std::invalid_argument when the shapes disagree.
GaussianParams make_params(const torch::Tensor& means,           // [N, 3]
                           const torch::Tensor& log_scales,      // [N, 3]
                           const torch::Tensor& quats,           // [N, 4]
                           const torch::Tensor& opacity_logits,  // [N]
                           const torch::Tensor& sh_dc,           // [N, 1, 3]
                           const torch::Tensor& sh_rest);        // [N, 15, 3]

// Learning rates. Defaults are INRIA 3DGS's; opacity follows gsplat and INRIA's original release
// (5e-2; INRIA's later repository uses 2.5e-2), see docs/gaussians.md.
struct LearningRates {
  double means_init = 1.6e-4;   // x scene extent, at step 0
  double means_final = 1.6e-6;  // x scene extent, from means_decay_steps on
  int64_t means_decay_steps = 30000;
  double scales = 5e-3;
  double quats = 1e-3;
  double opacities = 5e-2;
  double sh_dc = 2.5e-3;
  double sh_rest = 2.5e-3 / 20.0;  // higher bands move 20x slower (INRIA)
  double adam_eps = 1e-15;         // INRIA and gsplat: Adam is then close to sign descent
};

// extent * exp(lerp(log(init), log(final), clamp(step / decay_steps, 0, 1))).
double means_learning_rate(const LearningRates& rates, double extent, int64_t step);
// The six learning rates at `step`, in kGroupNames order.
std::array<double, 6> group_learning_rates(const LearningRates& rates, double extent,
                                           int64_t step);
// Adam (betas 0.9, 0.999, eps rates.adam_eps) with one param group per tensor, kGroupNames order.
std::unique_ptr<torch::optim::Adam> make_optimizer(const GaussianParams& params,
                                                   const LearningRates& rates, double extent);
// Sets each group's learning rate for `step` (groups found by the tensors they hold).
void set_learning_rates(torch::optim::Adam& optimizer, const GaussianParams& params,
                        const LearningRates& rates, double extent, int64_t step);

// INRIA's cameras_extent: 1.1 x the largest distance of a camera centre from their mean
// (getNerfppNorm). Positive: a single camera gives 1.1 x kMinExtent.
double scene_extent(const std::vector<data::Camera>& cameras);
constexpr double kMinExtent = 1e-6;  // keeps the extent-scaled thresholds non-zero

// k nearest neighbours of every point among the others (self excluded by index), exact, by a
// uniform grid searched in growing shells, parallel over points. Distances are computed in
// float64 from the float32 coordinates.
struct KnnResult {
  torch::Tensor dist2;    // [N, k] float64 squared distances, ascending; +inf where N - 1 < k
  torch::Tensor indices;  // [N, k] int64, -1 where N - 1 < k
};
// With a query range, only points [first, first + count) are looked up (count < 0: to the end)
// among all of them, and the result has `count` rows.
KnnResult knn(const torch::Tensor& points,  // [N, 3] float32, CPU
              int k, int64_t first = 0, int64_t count = -1);

struct InitOptions {
  int64_t random_count = 100000;  // Gaussians drawn when there are no points (or ignore_points)
  // Draw random_count Gaussians in the scene bounds even when the scene has points: benchmarks,
  // which need an exact count whatever the scene holds.
  bool ignore_points = false;
  uint64_t seed = 0;
  // Unbounded scenes (backgrounds beyond the bounds): the box everything seen lies in. Random
  // init then puts a kBackgroundShare of the Gaussians in the space between the bounds and this
  // box, uniformly in the contracted space of a contracted NeRF (kernels/ray_march.h), i.e. ever
  // sparser with the distance, as the backgrounds the cameras see are. Unset: all in the bounds.
  std::optional<std::array<double, 6>> extent;
  // Build only the even slice `part` of `parts` of the set (each rank its own share, so that no
  // rank holds the whole set; the neighbour search still sees every point). Rows are the same
  // as those of the whole set.
  int64_t part = 0, parts = 1;
};

// random_count's draw without points: n means uniform in `bounds` (and, with options.extent, a
// kBackgroundShare of them in the contracted shell out to it, see InitOptions) and colours
// uniform in [0, 1], row i a pure function of (options.seed, i).
struct RandomPoints {
  torch::Tensor means;    // [n, 3] float32
  torch::Tensor colours;  // [n, 3] float32 in [0, 1]
};
RandomPoints random_points(const std::array<double, 6>& bounds, const InitOptions& options,
                           int64_t n);

// From points: means = points, sh_dc = (rgb / 255 - 0.5) / C0, sh_rest = 0,
// log_scales = log(sqrt(max(mean of the 3 nearest squared distances, 1e-7))) on all three axes,
// quats = (1, 0, 0, 0), opacity_logits = logit(0.1). With no points (P = 0): random_count
// means uniform in `bounds` (and around it out to options.extent, see InitOptions) and colours
// uniform in [0, 1], a pure function of (seed, index).
GaussianParams init_from_points(const torch::Tensor& xyz,  // [P, 3] float32
                                const torch::Tensor& rgb,  // [P, 3] uint8
                                const std::array<double, 6>& bounds,  // xmin..zmax
                                const InitOptions& options, torch::Device device = torch::kCPU,
                                int64_t* total = nullptr);  // receives N, the whole set's size
// `options` with extent = the scene's extent when the scene is unbounded and none is set.
InitOptions with_scene_extent(const data::SceneReader& scene, InitOptions options);
// The scene's points (SceneReader) or, without any (or with options.ignore_points), random init
// in meta().scene_bounds, and out to meta().scene_extent for an unbounded scene.
GaussianParams init_from_scene(const data::SceneReader& scene, const InitOptions& options,
                               torch::Device device = torch::kCPU, int64_t* total = nullptr);

// Counter-based randomness shared by init and densify: pure functions of their arguments.
uint64_t hash_values(std::initializer_list<uint64_t> values);
double uniform_from_hash(uint64_t h);  // [0, 1), 53 bits
double normal_from_hash(uint64_t h);   // standard normal (Box-Muller on two derived uniforms)

}  // namespace tessera::models::gaussians
