// GaussianParams: groups, learning rates and initialization from points or at random (see
// gaussian_params.h and docs/gaussians.md); the exact grid kNN is in gaussian_knn.cpp.
#include "models/gaussians/gaussian_params.h"


#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "framework/hashing.h"

namespace tessera::models::gaussians {
namespace {

// What a random stream is for; mixed into every hash so that streams never collide.
constexpr uint64_t kPurposeInitPosition = 0x696e6974706f73ull;  // "initpos"
constexpr uint64_t kPurposeInitColour = 0x696e6974636f6cull;    // "initcol"
constexpr uint64_t kPurposeInitShell = 0x696e69747368656cull;    // "initshel"

void check_rows(const torch::Tensor& t, const char* name, int64_t n,
                std::initializer_list<int64_t> tail) {
  std::vector<int64_t> want{n};
  want.insert(want.end(), tail.begin(), tail.end());
  if (!t.defined() || t.sizes() != at::IntArrayRef(want))
    throw std::invalid_argument(std::string("gaussians: ") + name + " must be " +
                                c10::str(at::IntArrayRef(want)) + ", got " +
                                (t.defined() ? c10::str(t.sizes()) : "undefined"));
}

}  // namespace

uint64_t hash_values(std::initializer_list<uint64_t> values) {
  return chain_hash(0x6761757373ull, values);  // "gauss"
}

double uniform_from_hash(uint64_t h) {
  constexpr double kInv2Pow53 = 1.0 / 9007199254740992.0;
  return static_cast<double>(h >> 11) * kInv2Pow53;
}

double normal_from_hash(uint64_t h) {
  const double u1 = uniform_from_hash(splitmix64(h ^ 0x1ull));
  const double u2 = uniform_from_hash(splitmix64(h ^ 0x2ull));
  return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * M_PI * u2);  // 1 - u1 in (0, 1]
}

std::array<torch::Tensor*, 6> GaussianParams::fields() {
  return {&means, &log_scales, &quats, &opacity_logits, &sh_dc, &sh_rest};
}
std::array<const torch::Tensor*, 6> GaussianParams::fields() const {
  return {&means, &log_scales, &quats, &opacity_logits, &sh_dc, &sh_rest};
}

std::vector<ParamGroup> GaussianParams::parameter_groups() const {
  std::vector<ParamGroup> groups;
  const auto f = fields();
  for (size_t i = 0; i < f.size(); ++i) groups.push_back({kGroupNames[i], {*f[i]}});
  return groups;
}

void GaussianParams::make_leaves() {
  for (torch::Tensor* t : fields()) *t = t->detach().clone().set_requires_grad(true);
}

GaussianParams make_params(const torch::Tensor& means, const torch::Tensor& log_scales,
                           const torch::Tensor& quats, const torch::Tensor& opacity_logits,
                           const torch::Tensor& sh_dc, const torch::Tensor& sh_rest) {
  const int64_t n = means.defined() ? means.size(0) : 0;
  check_rows(means, "means", n, {3});
  check_rows(log_scales, "log_scales", n, {3});
  check_rows(quats, "quats", n, {4});
  check_rows(opacity_logits, "opacity_logits", n, {});
  check_rows(sh_dc, "sh_dc", n, {1, 3});
  check_rows(sh_rest, "sh_rest", n, {kShCoeffs - 1, 3});
  GaussianParams p{means, log_scales, quats, opacity_logits, sh_dc, sh_rest};
  for (torch::Tensor* t : p.fields())
    *t = t->detach().to(torch::kFloat32).clone().set_requires_grad(true);
  return p;
}

double means_learning_rate(const LearningRates& rates, double extent, int64_t step) {
  const double t = rates.means_decay_steps <= 0
                       ? 1.0
                       : std::clamp(static_cast<double>(step) / rates.means_decay_steps, 0.0, 1.0);
  return extent * std::exp(std::log(rates.means_init) * (1.0 - t) + std::log(rates.means_final) * t);
}

std::array<double, 6> group_learning_rates(const LearningRates& rates, double extent,
                                           int64_t step) {
  return {means_learning_rate(rates, extent, step), rates.scales, rates.quats, rates.opacities,
          rates.sh_dc, rates.sh_rest};
}

std::unique_ptr<torch::optim::Adam> make_optimizer(const GaussianParams& params,
                                                   const LearningRates& rates, double extent) {
  const auto lrs = group_learning_rates(rates, extent, 0);
  const auto f = params.fields();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t i = 0; i < f.size(); ++i)
    groups.emplace_back(std::vector<torch::Tensor>{*f[i]},
                        std::make_unique<torch::optim::AdamOptions>(
                            torch::optim::AdamOptions(lrs[i]).eps(rates.adam_eps)));
  return std::make_unique<torch::optim::Adam>(
      std::move(groups), torch::optim::AdamOptions(lrs[0]).eps(rates.adam_eps));
}

void set_learning_rates(torch::optim::Adam& optimizer, const GaussianParams& params,
                        const LearningRates& rates, double extent, int64_t step) {
  const auto lrs = group_learning_rates(rates, extent, step);
  const auto f = params.fields();
  for (auto& group : optimizer.param_groups()) {
    if (group.params().empty()) continue;
    for (size_t i = 0; i < f.size(); ++i)
      if (group.params()[0].unsafeGetTensorImpl() == f[i]->unsafeGetTensorImpl())
        static_cast<torch::optim::AdamOptions&>(group.options()).lr(lrs[i]);
  }
}

double scene_extent(const std::vector<data::Camera>& cameras) {
  constexpr double kInriaExtentMargin = 1.1;  // getNerfppNorm's radius = 1.1 x diagonal
  if (cameras.empty()) return kInriaExtentMargin * kMinExtent;
  double mean[3] = {0, 0, 0};
  for (const auto& c : cameras)
    for (int a = 0; a < 3; ++a) mean[a] += c.camera_to_world[a * 4 + 3] / cameras.size();
  double radius = 0;
  for (const auto& c : cameras) {
    double d2 = 0;
    for (int a = 0; a < 3; ++a) {
      const double d = c.camera_to_world[a * 4 + 3] - mean[a];
      d2 += d * d;
    }
    radius = std::max(radius, std::sqrt(d2));
  }
  return kInriaExtentMargin * std::max(radius, kMinExtent);
}

namespace {

// Random Gaussians of an unbounded scene: the share placed between the bounds and the extent.
// Half: the backgrounds of real captures fill most of each photo, the foreground the rest.
constexpr double kBackgroundShare = 0.5;

// Uniform samples of the contracted shell 1 < |q|_inf <= c_max around the bounds' frame (center,
// largest half-width), mapped back to world: |p|_inf = 1 / (2 - |q|_inf) (the inverse of the
// L-inf contraction), c_max = 2 - 1 / (extent reach), so that the samples stay in the extent.
class ShellSampler {
 public:
  ShellSampler(const std::array<double, 6>& bounds, const std::optional<std::array<double, 6>>& extent) {
    if (!extent) return;
    for (int a = 0; a < 3; ++a) {
      center_[a] = 0.5 * (bounds[a] + bounds[a + 3]);
      half_ = std::max(half_, 0.5 * (bounds[a + 3] - bounds[a]));
    }
    double reach = 0;  // the extent's farthest face, in foreground half-widths
    for (int a = 0; a < 3; ++a)
      reach = std::max({reach, (center_[a] - (*extent)[a]) / half_, ((*extent)[a + 3] - center_[a]) / half_});
    if (half_ > 0 && reach > 1.0) c_max_ = 2.0 - 1.0 / reach;
  }
  bool active() const { return c_max_ > 1.0; }
  // u: three uniforms in [0, 1) -> one world point in the shell.
  void place(const double u[3], float* out) const {
    // Radius with density ~ r^2 (the area of the cube shell at r), a face (axis and side) from
    // the first uniform's top bits, and the other two coordinates uniform on that face.
    const double r = std::cbrt(1.0 + u[0] * (c_max_ * c_max_ * c_max_ - 1.0));
    const int face = static_cast<int>(u[1] * 6.0);
    const int axis = face % 3;
    const double side = face < 3 ? -1.0 : 1.0;
    const double v = u[1] * 6.0 - face;  // what is left of u[1] after the face: uniform again
    double q[3];
    q[axis] = side * r;
    q[(axis + 1) % 3] = (2.0 * v - 1.0) * r;
    q[(axis + 2) % 3] = (2.0 * u[2] - 1.0) * r;
    const double world_reach = 1.0 / (2.0 - r);  // |p|_inf for |q|_inf = r
    for (int a = 0; a < 3; ++a)
      out[a] = static_cast<float>(center_[a] + half_ * q[a] / r * world_reach);
  }

 private:
  double center_[3] = {0, 0, 0};
  double half_ = 0;
  double c_max_ = 1.0;
};

}  // namespace

RandomPoints random_points(const std::array<double, 6>& bounds, const InitOptions& options,
                           int64_t n) {
  if (n < 0) throw std::invalid_argument("random_points: count must be >= 0");
  RandomPoints out{torch::empty({n, 3}, torch::kFloat32), torch::empty({n, 3}, torch::kFloat32)};
  float* m = out.means.data_ptr<float>();
  float* c = out.colours.data_ptr<float>();
  const ShellSampler shell(bounds, options.extent);
  for (int64_t i = 0; i < n; ++i) {
    double u[3];
    for (int a = 0; a < 3; ++a) {
      u[a] = uniform_from_hash(hash_values({options.seed, kPurposeInitPosition,
                                            static_cast<uint64_t>(i), static_cast<uint64_t>(a)}));
      m[i * 3 + a] = static_cast<float>(bounds[a] + (bounds[a + 3] - bounds[a]) * u[a]);
      c[i * 3 + a] = static_cast<float>(uniform_from_hash(hash_values(
          {options.seed, kPurposeInitColour, static_cast<uint64_t>(i), static_cast<uint64_t>(a)})));
    }
    if (shell.active() &&
        uniform_from_hash(hash_values({options.seed, kPurposeInitShell, static_cast<uint64_t>(i)})) <
            kBackgroundShare)
      shell.place(u, m + i * 3);
  }
  return out;
}

GaussianParams init_from_points(const torch::Tensor& xyz, const torch::Tensor& rgb,
                                const std::array<double, 6>& bounds, const InitOptions& options,
                                torch::Device device, int64_t* total) {
  torch::Tensor means, colours;
  if (xyz.defined() && xyz.numel() > 0) {
    if (xyz.dim() != 2 || xyz.size(1) != 3 || !rgb.defined() || rgb.sizes() != xyz.sizes())
      throw std::invalid_argument("init_from_points: xyz [P, 3] and rgb [P, 3] expected");
    means = xyz.to(torch::kCPU, torch::kFloat32).contiguous();
    colours = rgb.to(torch::kCPU, torch::kFloat32) / 255.0f;
  } else {
    if (options.random_count < 0)
      throw std::invalid_argument("init_from_points: random_count must be >= 0");
    RandomPoints random = random_points(bounds, options, options.random_count);
    means = random.means;
    colours = random.colours;
  }
  const auto [first, last] = even_slice(means.size(0), options.part, options.parts);
  if (total != nullptr) *total = means.size(0);
  const int64_t n = last - first;
  const KnnResult nn = knn(means, kInitNeighbours, first, n);
  means = means.slice(0, first, last);
  colours = colours.slice(0, first, last);
  // Mean over the neighbours that exist (fewer than 3 only when N <= 3); none: the floor.
  const torch::Tensor finite = torch::isfinite(nn.dist2);
  const torch::Tensor count = finite.sum(1).clamp_min(1).to(torch::kFloat64);
  const torch::Tensor mean_d2 =
      (torch::where(finite, nn.dist2, torch::zeros_like(nn.dist2)).sum(1) / count)
          .clamp_min(kMinInitDist2);
  const torch::Tensor log_scale = (0.5 * mean_d2.log()).to(torch::kFloat32);  // log(sqrt(d2))
  GaussianParams p = make_params(
      means, log_scale.unsqueeze(1).repeat({1, 3}),
      torch::tensor({1.0f, 0.0f, 0.0f, 0.0f}).repeat({n, 1}),
      torch::full({n}, static_cast<float>(std::log(kInitOpacity / (1.0 - kInitOpacity)))),
      ((colours - 0.5) / kShC0).unsqueeze(1), torch::zeros({n, kShCoeffs - 1, 3}));
  if (device != torch::kCPU)
    for (torch::Tensor* t : p.fields()) *t = t->detach().to(device).set_requires_grad(true);
  return p;
}

InitOptions with_scene_extent(const data::SceneReader& scene, InitOptions options) {
  if (scene.meta().unbounded() && !options.extent) options.extent = scene.meta().scene_extent;
  return options;
}

GaussianParams init_from_scene(const data::SceneReader& scene, const InitOptions& options,
                               torch::Device device, int64_t* total) {
  torch::Tensor xyz, rgb;
  if (scene.has_points() && !options.ignore_points) {
    xyz = scene.read_points_xyz();
    rgb = scene.read_points_rgb();
  }
  return init_from_points(xyz, rgb, scene.meta().scene_bounds, with_scene_extent(scene, options),
                          device, total);
}

}  // namespace tessera::models::gaussians
