// GaussianTrainer's step (see gaussian_trainer.h): the batch's targets and passes, the sharded
// forward and backward with the L1 + SSIM loss, Adam, and densification with world-size-
// independent global ids.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/autocast.h"
#include "framework/fused_adam.h"
#include "framework/data/lens.h"
#include "kernels/pointwise.h"
#include "models/gaussians/gaussian_render.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::models::gaussians {

torch::Tensor GaussianTrainer::target(int64_t camera_index, double scale) {
  const auto key = std::make_pair(camera_index, scale);
  auto it = targets_.find(key);
  if (it != targets_.end()) return it->second;
  const RenderCamera cam = make_render_camera(scene_.cameras()[camera_index], scale);
  // The rasterizer is a pinhole: a target taken through a distorted lens is undistorted first.
  const data::Camera& camera = scene_.cameras()[camera_index];
  torch::Tensor image = data::undistort_image(
      scene_.read_image_over_background(static_cast<size_t>(camera_index)), camera);
  image = resize_image(image, cam.width, cam.height).to(comm_.device());
  if (options_.cache_targets) {
    // Coarse-to-fine leaves a scale behind for good: drop the targets of other scales.
    for (auto old = targets_.begin(); old != targets_.end();)
      old = old->first.second != scale ? targets_.erase(old) : std::next(old);
    targets_[key] = image;
  }
  return image;
}

int64_t GaussianTrainer::views_per_pass_for(int64_t t, const std::vector<int64_t>& views) {
  const int64_t b = static_cast<int64_t>(views.size());
  if (options_.views_per_pass > 0) return std::min(options_.views_per_pass, b);
  if (options_.memory_budget_bytes < 0) return b;
  // The bitwise path sizes the passes as if one rank held every Gaussian: a split by each rank's
  // share would follow the world size, and the passes' split is part of the bits.
  const int64_t gaussians = options_.deterministic ? global_count() : params_.size();
  int64_t pixels = 0;  // the largest view of the batch at the step's scale
  for (int64_t v : views) {
    const RenderCamera cam = make_render_camera(scene_.cameras()[v], resolution_scale_at(t));
    pixels = std::max(pixels, cam.width * cam.height);
  }
  const int64_t per_view = estimate_view_bytes(gaussians, pixels);
  torch::Tensor fits = torch::tensor(
      {std::clamp<int64_t>(options_.memory_budget_bytes / std::max<int64_t>(1, per_view), 1, b)},
      torch::kInt64).to(comm_.device());
  comm_.allreduce(fits, distributed::ReduceOp::Min);
  return fits.cpu().item<int64_t>();
}

void GaussianTrainer::set_learning_rates(int64_t s) {
  const double scale =
      options_.sqrt_batch_lr_scaling ? std::sqrt(static_cast<double>(options_.views_per_step)) : 1;
  const auto lrs = group_learning_rates(options_.rates, extent_, s);
  auto& groups = optimizer_->param_groups();  // kGroupNames order (make_optimizer)
  for (size_t i = 0; i < kGroupNames.size() && i < groups.size(); ++i)
    static_cast<torch::optim::AdamOptions&>(groups[i].options()).lr(lrs[i] * scale);
}

std::optional<TorchOnOneThread> GaussianTrainer::bitwise_threads() const {
  return torch_on_one_thread_if(options_.deterministic, params_.means.device());
}

GaussianStepResult GaussianTrainer::step(int64_t t) {
  GaussianStepResult result = forward_backward(t);
  apply_step(t, /*skipped=*/false, result);
  return result;
}

GaussianStepResult GaussianTrainer::forward_backward(int64_t t, double loss_scale,
                                                     const std::string& precision) {
  const int64_t s = t + 1;
  phases_.start();
  const auto threads = bitwise_threads();
  GaussianStepResult result;
  result.views = batch_views(t);
  result.sh_degree = sh_degree_at(t);
  result.resolution_scale = resolution_scale_at(t);
  result.views_per_pass = views_per_pass_for(t, result.views);
  set_learning_rates(s);
  optimizer_->zero_grad();
  const bool stats = accumulates_stats(options_.densify, s);
  stats_before_step_ = DensifyStats{};
  if (stats)  // O(N) copies, put back if the step is skipped (apply_step)
    stats_before_step_ = DensifyStats{stats_.grad_norm_sum.clone(), stats_.count.clone(),
                                      stats_.max_radii.clone()};

  // The batch loss is the mean over its views; each pass backpropagates its views' share
  // (sum of its losses / B), so the gradients of the passes add up to the batch's. Every rank
  // holds the same loss; L / size with the allreduce-sum backward gives each rank's pixels
  // exactly the single-process gradient (the bitwise path: L itself, passed through).
  const int64_t b_count = static_cast<int64_t>(result.views.size());
  double loss_sum = 0;
  for (int64_t first = 0; first < b_count; first += result.views_per_pass) {
    const std::vector<int64_t> pass(
        result.views.begin() + first,
        result.views.begin() + std::min(b_count, first + result.views_per_pass));
    Batch batch;
    std::vector<data::Camera> cameras;
    for (int64_t v : pass) cameras.push_back(scene_.cameras()[v]);
    std::vector<torch::Tensor> images;
    {
      AutocastScope autocast(precision, comm_.device());
      images = forward(cameras, result.sh_degree, result.resolution_scale, true, &batch);
    }
    // The loss stays in float32: SSIM's variances (E[x^2] - E[x]^2) cancel catastrophically in
    // bf16 (2.4% off the float32 loss on the test scene).
    torch::Tensor loss;
    for (size_t b = 0; b < images.size(); ++b) {
      const torch::Tensor l =
          photometric_loss(images[b].to(torch::kFloat32),
                           target(pass[b], result.resolution_scale), options_.ssim_weight);
      loss = loss.defined() ? loss + l : l;
    }
    if (loss_hook) loss_hook(t, loss);
    loss_sum += loss.item<double>();
    phases_.lap("loss");
    // The backward charges loss, exchange and rasterize_bwd at the marks forward() left, then:
    const int64_t copies = options_.deterministic ? 1 : comm_.size();
    (loss * (loss_scale / static_cast<double>(b_count * copies))).backward();
    phases_.lap("project_bwd");
    if (stats) {
      torch::NoGradGuard no_grad;
      for (size_t b = 0; b < pass.size(); ++b) {
        const torch::Tensor grad = batch.means2d[b].grad();
        stats_.accumulate(batch.radii[b],
                          loss_scale == 1.0 || !grad.defined() ? grad : grad / loss_scale,
                          batch.widths[b], batch.heights[b]);
      }
      phases_.lap("stats");
    }
  }
  add_opacity_regularizer(loss_scale);
  result.loss = loss_sum / static_cast<double>(b_count);
  result.phases = phases_.times();
  return result;
}

// gaussians.opacity_reg: the gradient of w x mean over all N Gaussians of sigmoid(logit), added
// to each owned row's (w / N) sigmoid' (logit): elementwise, so the same at any world size.
void GaussianTrainer::add_opacity_regularizer(double loss_scale) {
  if (options_.opacity_reg <= 0) return;
  const double n = static_cast<double>(std::max<int64_t>(global_count(), 1));
  torch::NoGradGuard no_grad;
  const torch::Tensor o = kernels::pointwise::sigmoid(params_.opacity_logits.detach());
  const torch::Tensor g = o * (1 - o) * (options_.opacity_reg * loss_scale / n);
  torch::Tensor& grad = params_.opacity_logits.mutable_grad();
  grad = grad.defined() ? grad + g : g;
  phases_.lap("loss");
}

std::vector<torch::Tensor> GaussianTrainer::gradients() const {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor* f : params_.fields()) grads.push_back(f->grad());
  return grads;
}

void GaussianTrainer::apply_step(int64_t t, bool skipped, GaussianStepResult& result) {
  const int64_t s = t + 1;
  phases_.skip();  // the run's skip check since forward_backward is the run's to charge
  const auto threads = bitwise_threads();
  if (!skipped) {
    adam_step(*optimizer_);
    ++adam_steps_;
  } else if (stats_before_step_.count.defined()) {
    stats_ = stats_before_step_;  // the skipped batch's statistics may be non-finite
  }
  stats_before_step_ = DensifyStats{};
  ++steps_done_;
  phases_.lap("optimizer");

  // The schedule goes on through a skipped step: the rows are unchanged and finite.
  if (densifies(options_.densify, s)) densify(s, result);
  if (resets_opacity(options_.densify, s)) {
    reset_opacity(params_, optimizer_.get(), options_.densify);
    result.opacity_reset = true;
  }
  if (result.densified || (options_.rebalance_every > 0 && s % options_.rebalance_every == 0))
    result.rebalanced = rebalance(false).migrated;
  result.global_count = global_count();
  phases_.lap("densify");
  result.phases = phases_.times();
}

void GaussianTrainer::densify(int64_t s, GaussianStepResult& result) {
  torch::NoGradGuard no_grad;
  const torch::Tensor old_ids = ids_.cpu();
  const DensifyResult d = densify_and_prune(params_, optimizer_.get(), stats_, options_.densify,
                                            extent_, s, ids_);
  // New rows get ids next_id_, next_id_ + 1, ... in the canonical order of (parent id, child),
  // gathered from every rank: the ids a single rank would assign, whatever the world size.
  const torch::Tensor is_new = d.child >= 0;
  const torch::Tensor parents = old_ids.index_select(0, d.origin);
  const int64_t kids = options_.densify.split_children + 1;
  const torch::Tensor keys = parents * kids + d.child.clamp_min(0);  // unique per new row
  const torch::Tensor my_keys = keys.masked_select(is_new);
  const torch::Tensor all_keys =
      std::get<0>(comm_.allgatherv(my_keys.to(comm_.device())).cpu().sort());
  const torch::Tensor rank_in_all = torch::searchsorted(all_keys, my_keys);
  torch::Tensor ids = parents.clone();
  ids.masked_scatter_(is_new, rank_in_all + next_id_);
  next_id_ += all_keys.size(0);
  ids_ = ids.to(params_.means.device());

  torch::Tensor counts = torch::tensor({d.cloned, d.split, d.pruned}, torch::kInt64)
                             .to(comm_.device());
  comm_.allreduce(counts, distributed::ReduceOp::Sum);
  counts = counts.cpu();
  result.densified = true;
  result.cloned = counts[0].item<int64_t>();
  result.split = counts[1].item<int64_t>();
  result.pruned = counts[2].item<int64_t>();
}

}  // namespace tessera::models::gaussians
