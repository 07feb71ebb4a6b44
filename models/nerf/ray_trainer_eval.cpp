// The ray family's eval: renders views with their rows split across ranks (allgatherv assembles
// the image on every rank) and scores PSNR/SSIM against the dataset image.
#include "framework/metrics.h"
#include "models/nerf/ray_trainer.h"

namespace tessera::models::nerf {

torch::Tensor RayTrainer::render_view(size_t index, int64_t step) {
  return render_camera(scene_.cameras().at(index), step);
}

torch::Tensor RayTrainer::render_camera(const data::Camera& cam, int64_t step) {
  const int64_t h = cam.height, w = cam.width;
  // This rank's block of rows.
  const int64_t row0 = h * comm_.rank() / comm_.size(), row1 = h * (comm_.rank() + 1) / comm_.size();
  const int64_t n = (row1 - row0) * w;
  const torch::Tensor pix = torch::arange(row0 * w, row1 * w, torch::kInt64);
  const torch::Tensor y = pix.div(w, "floor"), x = pix - y * w;
  RayBatch all;
  pixel_rays({cam}, torch::zeros({n}, torch::kInt64), x, y, &all.origins, &all.directions);
  const auto& bg = scene_.meta().background;
  all.background = torch::tensor({static_cast<float>(bg[0]), static_cast<float>(bg[1]),
                                  static_cast<float>(bg[2])}).to(device_);
  StepContext ctx;
  ctx.step = step;
  ctx.seed = options_.seed;
  ctx.training = false;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  const int64_t chunk = std::max<int64_t>(1, options_.eval_chunk_rays);
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t m = std::min(chunk, n - b);
    RayBatch rays;
    rays.origins = all.origins.narrow(0, b, m).to(device_);
    rays.directions = all.directions.narrow(0, b, m).to(device_);
    rays.near = torch::full({m}, static_cast<float>(scene_.meta().near), device_);
    rays.far = torch::full({m}, static_cast<float>(scene_.meta().far), device_);
    rays.background = all.background;
    rays.ray_ids = torch::arange(row0 * w + b, row0 * w + b + m, torch::kInt64).to(device_);
    parts.push_back(model_.render(rays, ctx).rgb.to(torch::kFloat32));
  }
  torch::Tensor mine = parts.empty()
                           ? torch::zeros({0, 3}, torch::TensorOptions().device(comm_.device()))
                           : torch::cat(parts, 0).to(comm_.device());
  return comm_.allgatherv(mine.contiguous()).to(torch::kCPU).reshape({h, w, 3}).clamp(0.0, 1.0);
}

EvalScores RayTrainer::evaluate(int64_t step, const std::vector<size_t>& views,
                             const ImageSink& on_image) {
  double psnr_sum = 0.0, ssim_sum = 0.0;
  for (size_t view : views) {
    const torch::Tensor image = render_view(view, step);
    const torch::Tensor target = scene_.read_image_over_background(view);
    psnr_sum += psnr(image, target);
    ssim_sum += ssim(image, target);
    if (on_image) on_image(view, image, target);
  }
  const int64_t n = static_cast<int64_t>(views.size());
  return image_scores(n, n > 0 ? psnr_sum / n : 0.0, n > 0 ? ssim_sum / n : 0.0);
}

}  // namespace tessera::models::nerf
