// The ray family's eval: renders views with their pixels split across ranks in fixed chunks
// (allgatherv assembles the image on every rank) and scores PSNR/SSIM against the dataset image.
#include "framework/bench_util.h"
#include "framework/even_slice.h"
#include "framework/metrics.h"
#include "models/nerf/ray_trainer.h"

namespace tessera::models::nerf {

torch::Tensor RayTrainer::render_view(size_t index, int64_t step) {
  return render_camera(scene_.cameras().at(index), step);
}

torch::Tensor RayTrainer::render_camera(const data::Camera& cam, int64_t step) {
  return render_columns(cam, step, false).slice(2, 0, 3).clamp(0.0, 1.0);
}

std::string RayTrainer::render_layout() {
  return "the model replicated on " + std::to_string(comm_.size()) +
         " rank(s), each view's pixels split across them in chunks of " +
         std::to_string(options_.eval_chunk_rays) + " rays";
}

ViewOutputs RayTrainer::render_outputs(const data::Camera& cam, int64_t step) {
  const torch::Tensor all = render_columns(cam, step, true);
  ViewOutputs out;
  out.rgb = all.slice(2, 0, 3).clamp(0.0, 1.0);
  out.alpha = all.select(2, 4).clamp(0.0, 1.0).contiguous();
  out.depth = all.select(2, 3).contiguous();
  return out;
}

RayBatch RayTrainer::view_rays(const data::Camera& cam, const torch::Tensor& pix) const {
  const torch::Tensor y = pix.div(cam.width, "floor"), x = pix - y * cam.width;
  const int64_t n = pix.size(0);
  RayBatch rays;
  pixel_rays({cam}, torch::zeros({n}, torch::kInt64), x, y, &rays.origins, &rays.directions);
  rays.origins = rays.origins.to(device_);
  rays.directions = rays.directions.to(device_);
  rays.near = torch::full({n}, static_cast<float>(scene_.meta().near), device_);
  rays.far = torch::full({n}, static_cast<float>(scene_.meta().far), device_);
  const auto& bg = scene_.meta().background;
  rays.background = torch::tensor({static_cast<float>(bg[0]), static_cast<float>(bg[1]),
                                   static_cast<float>(bg[2])}).to(device_);
  rays.last_sample_background = scene_.meta().unbounded();
  rays.ray_ids = pix.to(device_);
  return rays;
}

double RayTrainer::eval_probe(const std::vector<size_t>& views, int64_t step) {
  // This rank's share of the eval's pixels (render_columns' chunks), and as many rays as a
  // training step's, spread evenly over all of the views' pixels: their render time is what
  // the eval's rays take at the model's current speed.
  const int64_t chunk = std::max<int64_t>(1, options_.eval_chunk_rays);
  int64_t total = 0, mine = 0;
  for (size_t v : views) {
    const data::Camera& cam = scene_.cameras().at(v);
    const auto [first, last] = chunk_slice(cam.width * cam.height, chunk, comm_.rank(), comm_.size());
    total += cam.width * cam.height;
    mine += last - first;
  }
  if (total == 0 || mine == 0) return 0.0;
  const int64_t count = std::min(total, options_.nerf.rays_per_step);
  StepContext ctx;
  ctx.step = step;
  ctx.seed = options_.seed;
  ctx.training = false;
  torch::NoGradGuard no_grad;
  bench::sync(device_);  // the step's queued work is not the probe's
  // The k-th probe ray lands on pixel k * total / count of the views' pixels, one after another.
  const torch::Tensor global = (torch::arange(count, torch::kInt64) * total).div(count, "floor");
  int64_t begin = 0;  // the pixels of the views before this one
  for (size_t v : views) {
    const data::Camera& cam = scene_.cameras().at(v);
    const int64_t pixels = cam.width * cam.height;
    const torch::Tensor pix = global.masked_select((global >= begin) & (global < begin + pixels)) - begin;
    if (pix.numel() > 0) {
      const RayBatch rays = view_rays(cam, pix);
      for (int64_t b = 0; b < pix.size(0); b += chunk)
        (void)model_.render(narrow_rays(rays, b, std::min(chunk, pix.size(0) - b)), ctx);
    }
    begin += pixels;
  }
  bench::sync(device_);  // the run times the call: the renders must be done, not queued
  return static_cast<double>(count) / static_cast<double>(mine);
}

torch::Tensor RayTrainer::render_columns(const data::Camera& cam, int64_t step, bool geometry) {
  const int64_t h = cam.height, w = cam.width;
  // This rank's chunks of the view's pixels (row-major): the view is cut into chunks of
  // eval_chunk_rays whatever the world size, so each pixel is rendered in the same chunk, with
  // the same shapes, on any number of ranks.
  const int64_t chunk = std::max<int64_t>(1, options_.eval_chunk_rays);
  const auto [first, last] = chunk_slice(h * w, chunk, comm_.rank(), comm_.size());
  const int64_t n = last - first;
  const RayBatch all = view_rays(cam, torch::arange(first, last, torch::kInt64));
  // The camera's optical axis in the world: the third column of camera_to_world (OpenCV, z
  // forward).
  const auto& m = cam.camera_to_world;
  const torch::Tensor forward_axis =
      torch::tensor({static_cast<float>(m[2]), static_cast<float>(m[6]), static_cast<float>(m[10])})
          .to(device_);
  StepContext ctx;
  ctx.step = step;
  ctx.seed = options_.seed;
  ctx.training = false;
  torch::NoGradGuard no_grad;
  const auto threads = bitwise_threads();  // the same pixels at any thread count
  std::vector<torch::Tensor> parts;
  for (int64_t b = 0; b < n; b += chunk) {
    const RayBatch rays = narrow_rays(all, b, std::min(chunk, n - b));
    const RenderResult r = model_.render(rays, ctx);
    if (!geometry) {
      parts.push_back(r.rgb.to(torch::kFloat32));
      continue;
    }
    // Expected z-depth: (sum w t / sum w) along the unit ray, times the ray's cosine to the
    // optical axis; 0 where nothing was hit.
    const torch::Tensor opacity = r.opacity.to(torch::kFloat32);
    const torch::Tensor cosine = (rays.directions * forward_axis).sum(1);
    const torch::Tensor depth = torch::where(
        opacity > 0, r.depth.to(torch::kFloat32) / opacity.clamp_min(1e-12) * cosine,
        torch::zeros_like(opacity));
    parts.push_back(torch::cat({r.rgb.to(torch::kFloat32), depth.unsqueeze(1),
                                opacity.unsqueeze(1)}, 1));
  }
  const int64_t columns = geometry ? 5 : 3;
  torch::Tensor mine = parts.empty() ? torch::zeros({0, columns},
                                                    torch::TensorOptions().device(comm_.device()))
                                     : torch::cat(parts, 0).to(comm_.device());
  return comm_.allgatherv(mine.contiguous()).to(torch::kCPU).reshape({h, w, columns});
}

EvalScores RayTrainer::evaluate(int64_t step, const std::vector<size_t>& views,
                             const ImageSink& on_image) {
  const auto threads = bitwise_threads();  // the renders and their scores at any thread count
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
