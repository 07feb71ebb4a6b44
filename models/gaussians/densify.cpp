// Adaptive density control (see densify.h): statistics, clone / split / prune / opacity reset,
// and the Adam-state surgery that keeps the optimizer in step with the parameter rows.
#include "models/gaussians/densify.h"

#include <cmath>
#include <stdexcept>

#include "kernels/gaussian_rasterize.h"
#include "kernels/pointwise.h"

namespace tessera::models::gaussians {
namespace {

constexpr uint64_t kPurposeSplit = 0x73706c6974ull;  // "split"

// Finds the group slot that holds `param` (by identity); nullptr when the optimizer lacks it.
torch::Tensor* find_param(torch::optim::Adam& optimizer, const torch::Tensor& param) {
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params())
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return &p;
  return nullptr;
}

// Swaps `old` for `fresh` in the optimizer and moves its state through `remap` (applied to each
// defined moment tensor). Does nothing when the optimizer does not hold `old`.
template <typename Remap>
void swap_param(torch::optim::Adam& optimizer, const torch::Tensor& old, const torch::Tensor& fresh,
                Remap remap) {
  torch::Tensor* slot = find_param(optimizer, old);
  if (slot == nullptr) return;
  auto& state = optimizer.state();
  void* old_key = old.unsafeGetTensorImpl();
  auto it = state.find(old_key);
  std::unique_ptr<torch::optim::OptimizerParamState> moved;
  if (it != state.end()) {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
    auto fresh_state = std::make_unique<torch::optim::AdamParamState>();
    fresh_state->step(s.step());
    if (s.exp_avg().defined()) fresh_state->exp_avg(remap(s.exp_avg()));
    if (s.exp_avg_sq().defined()) fresh_state->exp_avg_sq(remap(s.exp_avg_sq()));
    if (s.max_exp_avg_sq().defined()) fresh_state->max_exp_avg_sq(remap(s.max_exp_avg_sq()));
    moved = std::move(fresh_state);
    state.erase(old_key);
  }
  *slot = fresh;
  if (moved) state[fresh.unsafeGetTensorImpl()] = std::move(moved);
}

// Detached copies of the rows `idx` of every tensor.
GaussianParams select_rows(const GaussianParams& params, const torch::Tensor& idx) {
  GaussianParams p;
  const auto src = params.fields();
  const auto dst = p.fields();
  for (size_t i = 0; i < src.size(); ++i) *dst[i] = src[i]->detach().index_select(0, idx);
  return p;
}

}  // namespace

bool accumulates_stats(const DensifyOptions& o, int64_t step) { return step < o.densify_until; }

bool densifies(const DensifyOptions& o, int64_t step) {
  return step < o.densify_until && step > o.densify_from && o.densify_every > 0 &&
         step % o.densify_every == 0;
}

bool resets_opacity(const DensifyOptions& o, int64_t step) {
  return step < o.densify_until && o.opacity_reset_every > 0 && step % o.opacity_reset_every == 0;
}

void DensifyStats::reset(int64_t n, torch::Device device) {
  grad_norm_sum = torch::zeros({n}, torch::TensorOptions(torch::kFloat32).device(device));
  count = torch::zeros({n}, torch::TensorOptions(torch::kInt32).device(device));
  max_radii = torch::zeros({n}, torch::TensorOptions(torch::kInt32).device(device));
}

void DensifyStats::accumulate(const torch::Tensor& radii, const torch::Tensor& v_means2d,
                              int64_t width, int64_t height) {
  torch::NoGradGuard no_grad;
  if (!count.defined() || count.size(0) != radii.size(0))
    throw std::invalid_argument("DensifyStats::accumulate: " + std::to_string(radii.size(0)) +
                                " radii for statistics of " +
                                std::to_string(count.defined() ? count.size(0) : 0) + " Gaussians");
  const torch::Tensor visible = radii > 0;
  if (v_means2d.defined()) {
    const torch::Tensor norm =
        kernels::densify_grad_norm(v_means2d.to(torch::kFloat32), width, height);
    grad_norm_sum.add_(torch::where(visible, norm, torch::zeros_like(norm)));
  }
  count.add_(visible.to(torch::kInt32));
  max_radii = torch::where(visible, torch::maximum(max_radii, radii.to(torch::kInt32)), max_radii);
}

torch::Tensor DensifyStats::mean_grad() const {
  return torch::where(count > 0, grad_norm_sum / count.clamp_min(1).to(torch::kFloat32),
                      torch::zeros_like(grad_norm_sum));
}

void remap_gaussians(GaussianParams& params, torch::optim::Adam* optimizer,
                     const torch::Tensor& keep, const GaussianParams* extra) {
  torch::NoGradGuard no_grad;
  const auto fields = params.fields();
  const torch::Tensor keep_idx = keep.to(params.means.device(), torch::kInt64);
  for (size_t i = 0; i < fields.size(); ++i) {
    const torch::Tensor old = *fields[i];
    torch::Tensor data = old.detach().index_select(0, keep_idx);
    int64_t added = 0;
    if (extra != nullptr) {
      const torch::Tensor more = extra->fields()[i]->detach().to(old.options().requires_grad(false));
      added = more.size(0);
      data = torch::cat({data, more}, 0);
    }
    torch::Tensor fresh = data.contiguous().set_requires_grad(true);
    if (optimizer != nullptr)
      swap_param(*optimizer, old, fresh, [&](const torch::Tensor& moment) {
        torch::Tensor rows = moment.index_select(0, keep_idx.to(moment.device()));
        if (added == 0) return rows;
        std::vector<int64_t> shape = moment.sizes().vec();
        shape[0] = added;
        return torch::cat({rows, torch::zeros(shape, moment.options())}, 0);
      });
    *fields[i] = fresh;
  }
}

void prune_gaussians(GaussianParams& params, torch::optim::Adam* optimizer,
                     const torch::Tensor& prune) {
  const torch::Tensor keep = torch::nonzero(prune.logical_not()).flatten();
  remap_gaussians(params, optimizer, keep);
}

void reset_opacity(GaussianParams& params, torch::optim::Adam* optimizer,
                   const DensifyOptions& options) {
  torch::NoGradGuard no_grad;
  const torch::Tensor old = params.opacity_logits;
  const torch::Tensor capped =
      torch::minimum(kernels::pointwise::sigmoid(old.detach()), torch::full_like(old, options.reset_opacity));
  torch::Tensor fresh = kernels::pointwise::logit(capped).contiguous().set_requires_grad(true);
  if (optimizer != nullptr)
    swap_param(*optimizer, old, fresh,
               [](const torch::Tensor& moment) { return torch::zeros_like(moment); });
  params.opacity_logits = fresh;
}

torch::Tensor quat_to_rotmat(const torch::Tensor& quats) {
  const torch::Tensor q = quats / quats.norm(2, {1}, true);
  const torch::Tensor w = q.select(1, 0), x = q.select(1, 1), y = q.select(1, 2), z = q.select(1, 3);
  const torch::Tensor r = torch::stack(
      {1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
       2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
       2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)},
      1);
  return r.view({-1, 3, 3});
}

DensifyResult densify_and_prune(GaussianParams& params, torch::optim::Adam* optimizer,
                                DensifyStats& stats, const DensifyOptions& options, double extent,
                                int64_t step, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  const int64_t n = params.size();
  const torch::Device device = params.means.device();
  if (!stats.count.defined() || stats.count.size(0) != n)
    throw std::invalid_argument("densify_and_prune: statistics of " +
                                std::to_string(stats.count.defined() ? stats.count.size(0) : 0) +
                                " Gaussians for " + std::to_string(n));
  if (ids.defined() && (ids.dim() != 1 || ids.size(0) != n))
    throw std::invalid_argument("densify_and_prune: ids must be [N]");
  if (options.split_children < 1)
    throw std::invalid_argument("densify_and_prune: split_children must be >= 1");
  DensifyResult result;
  result.before = n;

  const torch::Tensor grads = stats.mean_grad().to(device);
  const torch::Tensor max_scale = std::get<0>(params.scales().detach().max(1));
  const torch::Tensor dense = max_scale <= options.percent_dense * extent;
  const torch::Tensor hot = grads >= options.grad_threshold;
  const torch::Tensor clone_mask = hot & dense;
  const torch::Tensor split_mask = hot & dense.logical_not();
  const torch::Tensor clone_idx = torch::nonzero(clone_mask).flatten();
  const torch::Tensor split_idx = torch::nonzero(split_mask).flatten();
  result.cloned = clone_idx.size(0);
  result.split = split_idx.size(0);

  // Clones: exact copies.
  GaussianParams extra = select_rows(params, clone_idx);
  // Children: child-major (every first child, then every second ...).
  const int64_t s = split_idx.size(0), kids = options.split_children;
  GaussianParams children = select_rows(params, split_idx.repeat({kids}));
  if (s > 0) {
    const torch::Tensor split_cpu = split_idx.cpu();
    const torch::Tensor id_cpu =
        ids.defined() ? ids.to(torch::kCPU, torch::kInt64).contiguous() : torch::Tensor();
    const int64_t* idp = id_cpu.defined() ? id_cpu.data_ptr<int64_t>() : nullptr;
    torch::Tensor z = torch::empty({kids * s, 3}, torch::kFloat64);
    double* zp = z.data_ptr<double>();
    const int64_t* sp = split_cpu.data_ptr<int64_t>();
    for (int64_t c = 0; c < kids; ++c)
      for (int64_t j = 0; j < s; ++j) {
        const int64_t row = sp[j];
        const uint64_t id = static_cast<uint64_t>(idp != nullptr ? idp[row] : row);
        for (int a = 0; a < 3; ++a)
          zp[(c * s + j) * 3 + a] = normal_from_hash(
              hash_values({options.seed, kPurposeSplit, static_cast<uint64_t>(step), id,
                           static_cast<uint64_t>(c), static_cast<uint64_t>(a)}));
      }
    const torch::Tensor parent_scales = kernels::pointwise::exp(children.log_scales);
    const torch::Tensor local = z.to(device, torch::kFloat32) * parent_scales;  // [kS, 3]
    const torch::Tensor rot = quat_to_rotmat(children.quats);                   // [kS, 3, 3]
    children.means = children.means + torch::bmm(rot, local.unsqueeze(2)).squeeze(2);
    children.log_scales = kernels::pointwise::log(parent_scales / options.split_scale_divisor);
  }
  for (size_t i = 0; i < extra.fields().size(); ++i)
    *extra.fields()[i] = torch::cat({*extra.fields()[i], *children.fields()[i]}, 0);

  // Prune over originals, then clones, then children.
  const torch::Tensor all_logits = torch::cat({params.opacity_logits.detach(), extra.opacity_logits});
  const torch::Tensor all_scales =
      kernels::pointwise::exp(torch::cat({params.log_scales.detach(), extra.log_scales}));
  torch::Tensor prune = kernels::pointwise::sigmoid(all_logits) < options.prune_opacity;
  if (step > options.opacity_reset_every) {
    const torch::Tensor radii = torch::cat(
        {stats.max_radii.to(device),
         torch::zeros({extra.size()}, torch::TensorOptions(torch::kInt32).device(device))});
    prune = prune | (radii > options.max_screen_radius) |
            (std::get<0>(all_scales.max(1)) > options.max_world_scale * extent);
  }
  torch::Tensor removed = prune.clone();
  removed.slice(0, 0, n).logical_or_(split_mask);
  result.pruned = prune.sum().item<int64_t>() -
                  (prune.slice(0, 0, n) & split_mask).sum().item<int64_t>();
  const torch::Tensor keep_all = torch::nonzero(removed.logical_not()).flatten();
  // keep_all indexes [originals | extra]: split it into the two sources.
  const torch::Tensor keep_orig = keep_all.masked_select(keep_all < n);
  const torch::Tensor keep_extra = keep_all.masked_select(keep_all >= n) - n;
  GaussianParams kept_extra = select_rows(extra, keep_extra);
  remap_gaussians(params, optimizer, keep_orig, &kept_extra);
  result.after = params.size();
  {  // Provenance: extra row e is clone_idx[e] (child 0), then split_idx child-major (child c).
    const torch::Tensor extra_parent = torch::cat({clone_idx, split_idx.repeat({kids})}).cpu();
    const torch::Tensor extra_child =
        torch::cat({torch::zeros({clone_idx.size(0)}, torch::kInt64),
                    torch::arange(kids, torch::kInt64).repeat_interleave(s)});
    const torch::Tensor ke = keep_extra.cpu();
    result.origin = torch::cat({keep_orig.cpu(), extra_parent.index_select(0, ke)});
    result.child = torch::cat({torch::full({keep_orig.size(0)}, -1, torch::kInt64),
                               extra_child.index_select(0, ke)});
  }
  stats.reset(result.after, stats.count.device());
  return result;
}

}  // namespace tessera::models::gaussians
