// The capacity plan of sharded 3DGS training (gaussian_plan.h): the measured costs put together.
#include "models/gaussians/gaussian_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "distributed/errors.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::models::gaussians {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw UserError("plan: " + message);
}

}  // namespace

CapacityPlan plan_capacity(const GaussianConfig& config, const PlanRequest& request) {
  require(request.gaussians >= 1 && static_cast<double>(request.gaussians) <= kMaxPlanGaussians,
          "--gaussians must be in [1, 1e15]");
  require(request.ranks >= 1, "--ranks must be at least 1");
  require(request.width >= 1 && request.height >= 1,
          "the image size is unknown: give --image-size (e.g. 1920x1080), or a config whose "
          "data.path is a dataset with train views");
  require(request.train_views >= 0, "--train-views must be >= 0");
  require(std::isfinite(request.gpu_memory_bytes) && request.gpu_memory_bytes >= 0 &&
              request.gpu_memory_bytes <= 1e18,
          "--gpu-memory must be a size up to 1 EB");
  require(request.usable_fraction > 0 && request.usable_fraction <= 1,
          "--usable must be in (0, 1]");
  require(request.visible_fraction >= 0 && request.visible_fraction <= 1,
          "--visible must be in [0, 1]");
  require(request.ranks_touched >= 1, "--ranks-touched must be at least 1");
  CapacityPlan plan;
  plan.request = request;
  plan.views_per_step = config.views_per_step;
  plan.sh_degree = config.max_sh_degree;
  const double pixels = static_cast<double>(request.width) * static_cast<double>(request.height);
  const int64_t n = request.ranks;
  plan.max_gaussians_per_rank = (request.gaussians + n - 1) / n;
  const double local = static_cast<double>(plan.max_gaussians_per_rank);
  // Views per pass as the trainer takes them: the config's, else what the memory budget allows
  // (GaussianTrainer::estimate_view_bytes; the minimum over ranks is the largest shard's), else
  // the whole batch.
  if (config.views_per_pass > 0) {
    plan.views_per_pass = std::min(config.views_per_pass, config.views_per_step);
  } else if (request.budget_bytes > 0) {
    const double per_view = static_cast<double>(GaussianTrainer::estimate_view_bytes(
        plan.max_gaussians_per_rank, request.width * request.height));
    plan.views_per_pass = static_cast<int64_t>(std::clamp(
        std::floor(request.budget_bytes / per_view), 1.0, static_cast<double>(config.views_per_step)));
  } else {
    plan.views_per_pass = config.views_per_step;
  }
  const double views_in_pass = static_cast<double>(plan.views_per_pass);
  const double batched = plan.views_per_pass > 1 ? kBatchedPassBytesPerGaussian : 0;
  const double state = kStateBytesPerGaussian + kBookkeepingBytesPerGaussian;
  const double backward_per_gaussian = state + kBackwardViewBytesPerGaussian + batched +
                                       kFurtherViewBytesPerGaussian * (views_in_pass - 1);
  const double backward_per_pixel = kBackwardBytesPerPixel * views_in_pass;
  // At the loss no gradient exists yet: a quarter of the state (one of four copies) less.
  const double loss_per_gaussian = state - kStateBytesPerGaussian / 4.0 + batched +
                                   kForwardViewBytesPerGaussian * views_in_pass;
  const double loss_per_pixel = kForwardBytesPerPixel * views_in_pass + kLossBytesPerPixel;
  const double cache =
      config.cache_targets ? static_cast<double>(request.train_views) * pixels * 3 * 4 : 0;
  plan.peak_at_loss = loss_per_gaussian * local + loss_per_pixel * pixels >
                      backward_per_gaussian * local + backward_per_pixel * pixels;
  const double per_gaussian = plan.peak_at_loss ? loss_per_gaussian : backward_per_gaussian;
  const double per_pixel = plan.peak_at_loss ? loss_per_pixel : backward_per_pixel;
  const double fixed = per_pixel * pixels + cache;
  const double peak = per_gaussian * local + fixed;
  require(peak < 9e18 && fixed * static_cast<double>(n) < 9e18,
          "the plan's byte counts overflow: ask for fewer Gaussians, ranks or pixels");
  plan.bytes_per_gaussian = static_cast<int64_t>(per_gaussian);
  plan.bytes_per_pixel = static_cast<int64_t>(per_pixel);
  plan.target_cache_bytes = static_cast<int64_t>(cache);
  plan.peak_bytes_per_rank = static_cast<int64_t>(peak);
  plan.peak_bytes_per_gaussian =
      (per_gaussian * static_cast<double>(request.gaussians) + fixed * static_cast<double>(n)) /
      static_cast<double>(request.gaussians);
  // A visible Gaussian goes to every rank whose tiles it touches; the owner keeps its own copy
  // (tiles are split by screen position, owners by 3D position: independent, so the owner is
  // among the touched ranks with probability 1 / N).
  const double views = static_cast<double>(plan.views_per_step);
  const double rows_to_others = static_cast<double>(request.gaussians) *
                                request.visible_fraction * request.ranks_touched *
                                static_cast<double>(n - 1) / static_cast<double>(n);
  plan.all_to_all_bytes_per_step =
      n > 1 ? views * rows_to_others * static_cast<double>(kExchangeBytesPerRow) : 0;
  // Every rank allreduces each view's image forward and its gradient backward (float32 RGB),
  // with several ranks also the per-tile intersection counts (float64), plus the run's 16-byte
  // agreement on skipping the step.
  const double tiles =
      static_cast<double>((request.width + config.tile_size - 1) / config.tile_size) *
      static_cast<double>((request.height + config.tile_size - 1) / config.tile_size);
  const double per_rank = views * (2 * pixels * 3 * 4 + (n > 1 ? tiles * 8 : 0)) + 16;
  plan.allreduce_bytes_per_step = per_rank * static_cast<double>(n);
  if (request.gpu_memory_bytes > 0) {
    plan.limited = true;
    const double usable = request.gpu_memory_bytes * request.usable_fraction;
    plan.fits = peak <= usable;
    // The most Gaussians per rank under both peaks.
    const double per_rank_count = std::floor(std::min(
        (usable - cache - backward_per_pixel * pixels) / backward_per_gaussian,
        (usable - cache - loss_per_pixel * pixels) / loss_per_gaussian));
    plan.max_count = per_rank_count > 0
                         ? static_cast<int64_t>(std::min(per_rank_count * static_cast<double>(n),
                                                         kMaxPlanGaussians))
                         : 0;
  }
  return plan;
}

std::string plan_json(const CapacityPlan& p) {
  char buffer[2048];
  const std::string max_count = p.limited ? std::to_string(p.max_count) : "null";
  const std::string gpu = p.limited ? std::to_string(static_cast<int64_t>(p.request.gpu_memory_bytes)) : "null";
  std::snprintf(
      buffer, sizeof buffer,
      "{\"plan\":\"gaussians\",\"count\":%lld,\"ranks\":%d,\"size\":%lld,\"height\":%lld,"
      "\"views_per_step\":%lld,\"views_per_pass\":%lld,\"sh_degree\":%d,"
      "\"peak_bytes_per_rank\":%lld,\"peak_bytes_per_gaussian\":%.1f,"
      "\"all_to_all_bytes_per_step\":%.0f,\"allreduce_bytes_per_step\":%.0f,"
      "\"max_gaussians_per_rank\":%lld,\"bytes_per_gaussian\":%lld,\"bytes_per_pixel\":%lld,"
      "\"peak_at\":\"%s\",\"target_cache_bytes\":%lld,\"gpu_memory_bytes\":%s,\"usable_fraction\":%.3g,"
      "\"fits\":%s,\"max_count\":%s,\"visible_fraction\":%.3g,\"ranks_touched\":%.3g}",
      static_cast<long long>(p.request.gaussians), p.request.ranks,
      static_cast<long long>(p.request.width), static_cast<long long>(p.request.height),
      static_cast<long long>(p.views_per_step), static_cast<long long>(p.views_per_pass),
      p.sh_degree, static_cast<long long>(p.peak_bytes_per_rank), p.peak_bytes_per_gaussian,
      p.all_to_all_bytes_per_step, p.allreduce_bytes_per_step,
      static_cast<long long>(p.max_gaussians_per_rank),
      static_cast<long long>(p.bytes_per_gaussian), static_cast<long long>(p.bytes_per_pixel),
      p.peak_at_loss ? "loss" : "backward", static_cast<long long>(p.target_cache_bytes), gpu.c_str(), p.request.usable_fraction,
      p.fits ? "true" : "false", max_count.c_str(), p.request.visible_fraction,
      p.request.ranks_touched);
  return buffer;
}

}  // namespace tessera::models::gaussians
