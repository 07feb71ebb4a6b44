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
         " rank(s), each view's pixels dealt to them in chunks of " +
         std::to_string(eval_chunk()) + " rays";
}

int64_t RayTrainer::eval_chunk() const {
  if (options_.eval_chunk_rays > 0) return options_.eval_chunk_rays;
  return device_.is_cuda() ? 16384 : 2048;
}

torch::Tensor RayTrainer::rank_pixels(int64_t pixels, int rank) const {
  std::vector<torch::Tensor> parts;
  for (const auto& [first, last] : strided_chunks(pixels, eval_chunk(), rank, comm_.size()))
    parts.push_back(torch::arange(first, last, torch::kInt64));
  return parts.empty() ? torch::zeros({0}, torch::kInt64) : torch::cat(parts);
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
  return view_rays({cam}, torch::zeros({pix.size(0)}, torch::kInt64), pix);
}

RayBatch RayTrainer::view_rays(const std::vector<data::Camera>& cameras, const torch::Tensor& camera,
                               const torch::Tensor& pix) const {
  std::vector<int64_t> widths;
  for (const data::Camera& cam : cameras) widths.push_back(cam.width);
  const torch::Tensor width = torch::tensor(widths, torch::kInt64).index_select(0, camera);
  const torch::Tensor y = pix.div(width, "floor"), x = pix - y * width;
  const int64_t n = pix.size(0);
  RayBatch rays;
  pixel_rays(cameras, camera, x, y, &rays.origins, &rays.directions);
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
  // As many of this rank's eval rays as a training step has, spread evenly over the pixels it
  // renders in the eval (render_columns' chunks of each view), gathered across the views and
  // rendered in calls of at most the eval's chunk (not one call per view, a few hundred rays: a
  // call's cost is not in proportion to its rays): their render time is what its share of the
  // eval takes at the model's current speed.
  const int64_t chunk = eval_chunk();
  std::vector<torch::Tensor> pixels;  // this rank's eval pixels, per view
  int64_t mine = 0;
  for (size_t v : views) {
    const data::Camera& cam = scene_.cameras().at(v);
    pixels.push_back(rank_pixels(cam.width * cam.height, comm_.rank()));
    mine += pixels.back().size(0);
  }
  if (mine == 0) return 0.0;
  const int64_t count = std::min(mine, options_.nerf.rays_per_step);
  // The k-th probe ray is this rank's pixel k * mine / count, counted over the views in order.
  const torch::Tensor picks = (torch::arange(count, torch::kInt64) * mine).div(count, "floor");
  std::vector<data::Camera> cameras;
  std::vector<torch::Tensor> camera, pix;  // per view: the picks' camera and pixel
  int64_t begin = 0;  // this rank's pixels of the views before this one
  for (size_t i = 0; i < views.size(); ++i) {
    const int64_t n = pixels[i].size(0);
    const torch::Tensor at = picks.masked_select((picks >= begin) & (picks < begin + n)) - begin;
    camera.push_back(torch::full({at.size(0)}, static_cast<int64_t>(i), torch::kInt64));
    pix.push_back(pixels[i].index_select(0, at));
    cameras.push_back(scene_.cameras().at(views[i]));
    begin += n;
  }
  const RayBatch rays = view_rays(cameras, torch::cat(camera), torch::cat(pix));
  StepContext ctx;
  ctx.step = step;
  ctx.seed = options_.seed;
  ctx.training = false;
  torch::NoGradGuard no_grad;
  bench::sync(device_);  // the step's queued work is not the probe's
  for (int64_t b = 0; b < count; b += chunk)
    (void)model_.render(narrow_rays(rays, b, std::min(chunk, count - b)), ctx);
  bench::sync(device_);  // the run times the call: the renders must be done, not queued
  return static_cast<double>(count) / static_cast<double>(mine);
}

torch::Tensor RayTrainer::render_columns(const data::Camera& cam, int64_t step, bool geometry) {
  const int64_t h = cam.height, w = cam.width;
  // This rank's chunks of the view's pixels (row-major): the view is cut into chunks of
  // eval_chunk() whatever the world size, so each pixel is rendered in the same chunk, with the
  // same shapes, on any number of ranks; the chunks are dealt round-robin, so each rank renders
  // some of every part of the view (a view's rows differ in cost: the near table at the bottom
  // of the fruit capture's views renders more samples than its far side at the top). Every
  // chunk but the view's last is `chunk` long, and the view's last chunk is the last of the rank
  // that gets it, so cutting this rank's pixels every `chunk` rays gives back its chunks.
  const int64_t chunk = eval_chunk();
  std::vector<torch::Tensor> order;  // every rank's pixels, in rank order
  for (int r = 0; r < comm_.size(); ++r) order.push_back(rank_pixels(h * w, r));
  const torch::Tensor& pixels = order[comm_.rank()];
  const int64_t n = pixels.size(0);
  const RayBatch all = view_rays(cam, pixels);
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
  // allgatherv concatenates the ranks' pixels in rank order; each goes back to its place.
  const torch::Tensor gathered = comm_.allgatherv(mine.contiguous()).to(torch::kCPU);
  return torch::empty({h * w, columns}, gathered.options())
      .index_copy_(0, torch::cat(order), gathered)
      .reshape({h, w, columns});
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
