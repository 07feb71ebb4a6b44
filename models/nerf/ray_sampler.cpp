// RaySampler: epochs of the sampling schedule, the per-epoch shuffled pixel pool, batches of
// pixel ids and their rays (OpenCV cameras with lens distortion; docs/training_loop.md).
#include "models/nerf/ray_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/data/lens.h"
#include "framework/hashing.h"
#include "kernels/cpu/parallel.h"

namespace tessera::models::nerf {

namespace {

// Rays per at::parallel_for task when undistorting: a Newton solve costs ~100 flops, so smaller
// tasks would spend more on scheduling than on work.
constexpr int64_t kRaysPerUndistortTask = 2048;

// Replaces the distorted normalized coordinates (dx, dy) of each ray by the undistorted ones of
// its camera (data::undistort); rays of cameras without distortion are left exactly as they are.
void undistort_in_place(const std::vector<data::Camera>& cameras, const torch::Tensor& camera,
                        torch::Tensor* dx, torch::Tensor* dy) {  // [R] int64, [R] f64, [R] f64
  *dx = dx->contiguous(), *dy = dy->contiguous();
  const torch::Tensor index = camera.to(torch::kInt64).contiguous();
  const int64_t* cam = index.data_ptr<int64_t>();
  double* xs = dx->data_ptr<double>();
  double* ys = dy->data_ptr<double>();
  tessera::parallel_for(0, dx->numel(), kRaysPerUndistortTask, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const data::Camera& c = cameras[static_cast<size_t>(cam[i])];
      if (data::has_distortion(c)) data::undistort(c, xs[i], ys[i], &xs[i], &ys[i]);
    }
  });
}

}  // namespace

uint64_t hash_seed(uint64_t seed, uint64_t index, const char* purpose) {
  uint64_t h = 14695981039346656037ULL;  // FNV-1a of the purpose
  for (const char* p = purpose; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ULL;
  return splitmix64(splitmix64(splitmix64(seed) ^ index) ^ h);
}

void pixel_rays(const std::vector<data::Camera>& cameras, const torch::Tensor& camera,
                const torch::Tensor& x, const torch::Tensor& y, torch::Tensor* origins,
                torch::Tensor* directions, const torch::Tensor& subpixel) {
  const int64_t c = static_cast<int64_t>(cameras.size());
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor intr = torch::empty({c, 4}, f64);    // fx, fy, cx, cy
  torch::Tensor pose = torch::empty({c, 3, 4}, f64);  // camera_to_world rows 0..2
  auto ia = intr.accessor<double, 2>();
  auto pa = pose.accessor<double, 3>();
  for (int64_t i = 0; i < c; ++i) {
    const data::Camera& cam = cameras[i];
    ia[i][0] = cam.fx, ia[i][1] = cam.fy, ia[i][2] = cam.cx, ia[i][3] = cam.cy;
    for (int r = 0; r < 3; ++r)
      for (int k = 0; k < 4; ++k) pa[i][r][k] = cam.camera_to_world[r * 4 + k];
  }
  const torch::Tensor in = intr.index_select(0, camera);  // [R, 4]
  const torch::Tensor p = pose.index_select(0, camera);   // [R, 3, 4]
  torch::Tensor px = x.to(torch::kFloat64), py = y.to(torch::kFloat64);  // [R]
  if (subpixel.defined()) {
    px = px + subpixel.select(1, 0).to(torch::kFloat64);
    py = py + subpixel.select(1, 1).to(torch::kFloat64);
  } else {
    px = px + 0.5, py = py + 0.5;
  }
  torch::Tensor dx = (px - in.select(1, 2)) / in.select(1, 0);  // [R]
  torch::Tensor dy = (py - in.select(1, 3)) / in.select(1, 1);  // [R]
  if (std::any_of(cameras.begin(), cameras.end(), data::has_distortion))
    undistort_in_place(cameras, camera, &dx, &dy);
  const torch::Tensor d_cam = torch::stack({dx, dy, torch::ones_like(dx)}, 1);  // [R, 3]
  torch::Tensor d = torch::bmm(p.narrow(2, 0, 3), d_cam.unsqueeze(2)).squeeze(2);
  d = d / d.norm(2, 1, true);
  *directions = d.to(torch::kFloat32);
  *origins = p.select(2, 3).to(torch::kFloat32).contiguous();
}

RaySampler::RaySampler(const data::SceneReader& scene, RaySamplerOptions options,
                       std::function<double(int64_t)> rate_at)
    : options_(options), rate_at_(std::move(rate_at)) {
  if (options_.rays_per_step <= 0)
    throw UserError("nerf.rays_per_step must be > 0 (got " +
                    std::to_string(options_.rays_per_step) + ")");
  train_ = scene.indices(data::Split::Train);
  if (train_.empty())
    throw UserError("dataset " + scene.path() + " has no train images (cameras/split == 0)");
  std::vector<torch::Tensor> rgb, alpha;
  std::vector<int64_t> offsets{0}, widths;
  for (size_t index : train_) {
    const data::Camera& cam = scene.cameras()[index];
    cameras_.push_back(cam);
    rgb.push_back(scene.read_image(index).reshape({-1, 3}));
    if (scene.has_alpha()) alpha.push_back(scene.read_alpha(index).reshape({-1}));
    offsets.push_back(offsets.back() + int64_t{cam.width} * cam.height);
    widths.push_back(cam.width);
  }
  rgb_ = torch::cat(rgb, 0);
  if (!alpha.empty()) alpha_ = torch::cat(alpha, 0);
  offsets_ = torch::tensor(offsets, torch::kInt64);
  widths_ = torch::tensor(widths, torch::kInt64);
  num_pixels_ = offsets.back();
  const auto& bg = scene.meta().background;
  background_ = torch::tensor({static_cast<float>(bg[0]), static_cast<float>(bg[1]),
                               static_cast<float>(bg[2])});
  unbounded_ = scene.meta().unbounded();
  near_ = scene.meta().near;
  far_ = scene.meta().far;
}

SamplingEpoch RaySampler::epoch_of(int64_t step) {
  if (step < 0) throw std::invalid_argument("RaySampler: negative step");
  std::lock_guard<std::mutex> lock(mutex_);
  while (epochs_.empty() || epochs_.back().first_step + epochs_.back().steps <= step) {
    SamplingEpoch e;
    if (!epochs_.empty()) {
      e.index = epochs_.back().index + 1;
      e.first_step = epochs_.back().first_step + epochs_.back().steps;
    }
    e.rate = rate_at_(e.first_step);
    if (!(e.rate > 0.0) || e.rate > 1.0)
      throw UserError("sampling rate must be in (0, 1]; the schedule gave " +
                      std::to_string(e.rate) + " at step " + std::to_string(e.first_step));
    e.pool = std::min<int64_t>(
        num_pixels_, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(e.rate * num_pixels_))));
    e.steps = std::max<int64_t>(1, e.pool / options_.rays_per_step);
    epochs_.push_back(e);
  }
  // Binary search: epochs are sorted by first_step.
  size_t lo = 0, hi = epochs_.size() - 1;
  while (lo < hi) {
    const size_t mid = (lo + hi + 1) / 2;
    if (epochs_[mid].first_step <= step) lo = mid; else hi = mid - 1;
  }
  return epochs_[lo];
}

torch::Tensor RaySampler::pool_order(const SamplingEpoch& epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cached_epoch_ != epoch.index) {
    // A random permutation of all pixels; its first `pool` entries are a uniformly random subset
    // visited in a uniformly random order.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(
        hash_seed(options_.seed, static_cast<uint64_t>(epoch.index), "pool"));
    cached_order_ = torch::randperm(num_pixels_, gen, torch::kInt64).narrow(0, 0, epoch.pool);
    cached_epoch_ = epoch.index;
  }
  return cached_order_;
}

torch::Tensor RaySampler::global_batch(int64_t step) {
  const SamplingEpoch epoch = epoch_of(step);
  const torch::Tensor order = pool_order(epoch);
  const int64_t r = options_.rays_per_step;
  // Batch b of the epoch takes positions [b R, (b + 1) R) of the pool, wrapping when pool < R.
  const torch::Tensor pos =
      (torch::arange(r, torch::kInt64) + (step - epoch.first_step) * r).remainder(epoch.pool);
  return order.index_select(0, pos);
}

std::pair<int64_t, int64_t> RaySampler::rank_slice(int64_t rays, int rank, int size) {
  return {rays * rank / size, rays * (rank + 1) / size};
}

RayBatch RaySampler::rays_for(const torch::Tensor& ids, int64_t first_ray_id,
                              torch::Device device, int64_t step) const {
  const int64_t n = ids.size(0);
  // Image of each pixel id: the last offset <= id.
  const torch::Tensor image =
      torch::searchsorted(offsets_, ids, /*out_int32=*/false, /*right=*/true) - 1;
  const torch::Tensor local = ids - offsets_.index_select(0, image);
  const torch::Tensor w = widths_.index_select(0, image);
  const torch::Tensor y = local.div(w, "floor"), x = local - y * w;
  RayBatch batch;
  // One hash per (seed, step, ray id, purpose): the same on any rank and batch split.
  auto ray_hash = [&](int64_t i, const char* purpose) {
    return hash_seed(options_.seed,
                     static_cast<uint64_t>(step) * static_cast<uint64_t>(options_.rays_per_step) +
                         static_cast<uint64_t>(first_ray_id + i),
                     purpose);
  };
  torch::Tensor subpixel;  // undefined: pixel centers
  if (options_.pixel_jitter && step >= 0) {
    subpixel = torch::empty({n, 2}, torch::kFloat64);  // two 32-bit uniforms of one hash a ray
    double* sp = subpixel.data_ptr<double>();
    constexpr double kInv2Pow32 = 1.0 / 4294967296.0;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t h = ray_hash(i, "subpixel");
      sp[i * 2] = static_cast<double>(h & 0xFFFFFFFFu) * kInv2Pow32;
      sp[i * 2 + 1] = static_cast<double>(h >> 32) * kInv2Pow32;
    }
  }
  pixel_rays(cameras_, image, x, y, &batch.origins, &batch.directions, subpixel);
  torch::Tensor rgb = rgb_.index_select(0, ids).to(torch::kFloat32) / 255.0f;
  batch.background = background_.clone();
  if ((alpha_.defined() || unbounded_) && options_.random_background && step >= 0) {
    // One color per ray from (seed, step, ray id): the same on any rank and batch split.
    batch.background = torch::empty({n, 3}, torch::kFloat32);
    float* bg = batch.background.data_ptr<float>();
    constexpr float kInv2Pow21 = 1.0f / 2097152.0f;  // three 21-bit channels of one hash
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t h = ray_hash(i, "background");
      for (int c = 0; c < 3; ++c)
        bg[i * 3 + c] = static_cast<float>((h >> (21 * c)) & 0x1FFFFF) * kInv2Pow21;
    }
  }
  if (alpha_.defined()) {
    const torch::Tensor a = alpha_.index_select(0, ids).to(torch::kFloat32).unsqueeze(1) / 255.0f;
    rgb = rgb * a + batch.background.reshape({-1, 3}) * (1.0f - a);
  }
  batch.target_rgb = rgb;
  batch.near = torch::full({n}, static_cast<float>(near_));
  batch.far = torch::full({n}, static_cast<float>(far_));
  batch.ray_ids = torch::arange(first_ray_id, first_ray_id + n, torch::kInt64);
  for (torch::Tensor* t : {&batch.origins, &batch.directions, &batch.near, &batch.far,
                           &batch.target_rgb, &batch.background, &batch.ray_ids})
    *t = t->to(device);
  return batch;
}

RayBatch RaySampler::rank_batch(int64_t step, int rank, int size, torch::Device device) {
  const auto [begin, end] = rank_slice(options_.rays_per_step, rank, size);
  return rays_for(global_batch(step).narrow(0, begin, end - begin), begin, device, step);
}

}  // namespace tessera::models::nerf
