// CPU volume_render_fwd / volume_render_bwd: a vectorized exp over all samples, then one sequential
// front-to-back pass per ray (kernels/volume_render_math.h, shared with CUDA), rays split across
// threads by at::parallel_for. Backward recomputes transmittance instead of storing it.
#include "kernels/cpu/parallel.h"
#include "kernels/volume_render.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "kernels/tensor_args.h"
#include "kernels/volume_render_math.h"

namespace tessera::kernels::cpu {

namespace {

// Samples per parallel task. Compositing costs ~3 ns a sample forward and ~5 ns backward on one
// core (bench_volume_render), so 16k samples are 50-80 us of work: far above the few microseconds
// it costs to hand out a task, while a typical batch (4096 rays x 64 samples) still splits into
// 16 tasks, enough for every core.
constexpr int64_t kSamplesPerTask = 1 << 14;

// Rays per task, from the mean samples per ray (rays differ in length; the mean is what a
// contiguous block of rays costs on average).
int64_t rays_per_task(int64_t num_rays, int64_t num_samples) {
  const int64_t mean_samples = std::max<int64_t>(1, num_samples / std::max<int64_t>(1, num_rays));
  return std::max<int64_t>(1, kSamplesPerTask / mean_samples);
}

// The offsets must cover [0, S) once, in order: checked per ray inside the loops, ends here.
void check_offset_ends(const int64_t* offsets, int64_t num_rays, int64_t num_samples) {
  TORCH_CHECK(offsets[0] == 0 && offsets[num_rays] == num_samples,
              "volume_render: ray_offsets must start at 0 and end at S = ", num_samples,
              "; got ", offsets[0], " and ", offsets[num_rays]);
}

void check_ray(int64_t ray, int64_t start, int64_t end, int64_t num_samples) {
  TORCH_CHECK(0 <= start && start <= end && end <= num_samples,
              "volume_render: ray_offsets must be non-decreasing within [0, S = ", num_samples,
              "]; ray ", ray, " owns [", start, ", ", end, ")");
}

// exp(-sigma * delta) for every sample, written into `out`, an output buffer that the per-ray
// pass then overwrites in place. ATen's vectorized exp is several times faster than a scalar
// std::exp per sample, and it leaves the sequential pass with multiply-adds only.
void survival_into(torch::Tensor& out,             // [S]
                   const torch::Tensor& sigmas,    // [S]
                   const torch::Tensor& deltas) {  // [S]
  const torch::NoGradGuard no_grad;  // out= ops refuse inputs that require grad
  at::mul_out(out, sigmas, deltas).neg_().exp_();
}

// out_weights holds exp(-sigma_i * delta_i) on entry (survival_into) and the weights on exit.
template <typename scalar_t>
void composite_rays(const scalar_t* __restrict__ rgbs,     // [S, 3]
                    const scalar_t* __restrict__ ts,       // [S]
                    const int64_t* __restrict__ offsets,   // [R + 1]
                    int64_t num_rays, int64_t num_samples, scalar_t threshold,
                    scalar_t* __restrict__ out_rgb,        // [R, 3]
                    scalar_t* __restrict__ out_opacity,    // [R]
                    scalar_t* __restrict__ out_depth,      // [R]
                    scalar_t* out_weights,                 // [S]
                    int64_t* __restrict__ out_num_steps) { // [R]
  const int64_t grain = rays_per_task(num_rays, num_samples);
  tessera::parallel_for(0, num_rays, grain, [&](int64_t begin, int64_t end) {
    for (int64_t ray = begin; ray < end; ++ray) {
      const int64_t first = offsets[ray];
      const int64_t last = offsets[ray + 1];
      check_ray(ray, first, last, num_samples);
      const auto c = volume_math::composite_ray<scalar_t>(
          first, last, threshold, [&](int64_t i) { return out_weights[i]; }, rgbs, ts,
          out_weights);
      volume_math::store_ray(c, ray, out_rgb, out_opacity, out_depth, out_num_steps);
    }
  });
}

// volume_math::backprop_ray per ray. v_sigmas holds exp(-sigma_i * delta_i) on entry
// (survival_into) and the gradient on exit.
template <typename scalar_t>
void backprop_rays(const scalar_t* __restrict__ rgbs,       // [S, 3]
                   const scalar_t* __restrict__ deltas,     // [S]
                   const scalar_t* __restrict__ ts,         // [S]
                   const int64_t* __restrict__ offsets,     // [R + 1]
                   const scalar_t* __restrict__ rgb,        // [R, 3]
                   const scalar_t* __restrict__ opacity,    // [R]
                   const scalar_t* __restrict__ depth,      // [R]
                   const scalar_t* __restrict__ weights,    // [S]
                   const int64_t* __restrict__ num_steps,   // [R]
                   const scalar_t* __restrict__ v_rgb,      // [R, 3] or null (zero)
                   const scalar_t* __restrict__ v_opacity,  // [R] or null
                   const scalar_t* __restrict__ v_depth,    // [R] or null
                   const scalar_t* __restrict__ v_weights,  // [S] or null
                   int64_t num_rays, int64_t num_samples,
                   scalar_t* v_sigmas,                      // [S]
                   scalar_t* __restrict__ v_rgbs) {         // [S, 3]
  const int64_t grain = rays_per_task(num_rays, num_samples);
  tessera::parallel_for(0, num_rays, grain, [&](int64_t begin, int64_t end) {
    for (int64_t ray = begin; ray < end; ++ray) {
      const int64_t first = offsets[ray];
      const int64_t last = offsets[ray + 1];
      check_ray(ray, first, last, num_samples);
      const int64_t stop = first + num_steps[ray];
      TORCH_CHECK(first <= stop && stop <= last, "volume_render_bwd: num_steps[", ray, "] = ",
                  num_steps[ray], " does not fit the ray's ", last - first, " samples");
      volume_math::backprop_ray<scalar_t>(
          first, stop, last, [&](int64_t i) { return v_sigmas[i]; },
          volume_math::ray_cotangent(ray, v_rgb, v_opacity, v_depth), rgb + 3 * ray,
          opacity[ray], depth[ray], rgbs, deltas, ts, weights, v_weights, v_sigmas, v_rgbs);
    }
  });
}

}  // namespace

VolumeRenderOutput volume_render_fwd(const torch::Tensor& sigmas, const torch::Tensor& rgbs,
                                     const torch::Tensor& deltas, const torch::Tensor& ts,
                                     const torch::Tensor& ray_offsets,
                                     double transmittance_threshold) {
  const torch::Tensor rgb = rgbs.contiguous(), t = ts.contiguous(),
                      offsets = ray_offsets.contiguous();
  const int64_t num_samples = sigmas.size(0);
  const int64_t num_rays = offsets.size(0) - 1;
  const auto options = sigmas.options();
  VolumeRenderOutput out;
  out.rgb = torch::empty({num_rays, 3}, options);
  out.opacity = torch::empty({num_rays}, options);
  out.depth = torch::empty({num_rays}, options);
  out.weights = torch::empty({num_samples}, options);
  out.num_steps = torch::empty({num_rays}, offsets.options());
  check_offset_ends(offsets.data_ptr<int64_t>(), num_rays, num_samples);
  if (num_rays == 0) return out;
  survival_into(out.weights, sigmas, deltas);
  AT_DISPATCH_FLOATING_TYPES(sigmas.scalar_type(), "volume_render_fwd_cpu", [&] {
    composite_rays<scalar_t>(
        rgb.data_ptr<scalar_t>(), t.data_ptr<scalar_t>(), offsets.data_ptr<int64_t>(), num_rays,
        num_samples, static_cast<scalar_t>(transmittance_threshold), out.rgb.data_ptr<scalar_t>(),
        out.opacity.data_ptr<scalar_t>(), out.depth.data_ptr<scalar_t>(),
        out.weights.data_ptr<scalar_t>(), out.num_steps.data_ptr<int64_t>());
  });
  return out;
}

VolumeRenderGrads volume_render_bwd(const torch::Tensor& sigmas, const torch::Tensor& rgbs,
                                    const torch::Tensor& deltas, const torch::Tensor& ts,
                                    const torch::Tensor& ray_offsets, const torch::Tensor& rgb,
                                    const torch::Tensor& opacity, const torch::Tensor& depth,
                                    const torch::Tensor& weights, const torch::Tensor& num_steps,
                                    const torch::Tensor& v_rgb, const torch::Tensor& v_opacity,
                                    const torch::Tensor& v_depth, const torch::Tensor& v_weights) {
  const torch::Tensor color = rgbs.contiguous(),
                      delta = deltas.contiguous(), t = ts.contiguous(),
                      offsets = ray_offsets.contiguous(), out_rgb = rgb.contiguous(),
                      out_opacity = opacity.contiguous(), out_depth = depth.contiguous(),
                      out_weights = weights.contiguous(), steps = num_steps.contiguous();
  const torch::Tensor g_rgb = contiguous_or_undefined(v_rgb),
                      g_opacity = contiguous_or_undefined(v_opacity),
                      g_depth = contiguous_or_undefined(v_depth),
                      g_weights = contiguous_or_undefined(v_weights);
  const int64_t num_samples = sigmas.size(0);
  const int64_t num_rays = offsets.size(0) - 1;
  const auto options = sigmas.options();
  VolumeRenderGrads grads;
  grads.v_sigmas = torch::empty({num_samples}, options);
  grads.v_rgbs = torch::empty({num_samples, 3}, options);
  check_offset_ends(offsets.data_ptr<int64_t>(), num_rays, num_samples);
  if (num_rays == 0) return grads;
  survival_into(grads.v_sigmas, sigmas, delta);
  AT_DISPATCH_FLOATING_TYPES(sigmas.scalar_type(), "volume_render_bwd_cpu", [&] {
    backprop_rays<scalar_t>(
        color.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), t.data_ptr<scalar_t>(),
        offsets.data_ptr<int64_t>(), out_rgb.data_ptr<scalar_t>(),
        out_opacity.data_ptr<scalar_t>(), out_depth.data_ptr<scalar_t>(),
        out_weights.data_ptr<scalar_t>(), steps.data_ptr<int64_t>(),
        optional_ptr<scalar_t>(g_rgb), optional_ptr<scalar_t>(g_opacity),
        optional_ptr<scalar_t>(g_depth), optional_ptr<scalar_t>(g_weights), num_rays,
        num_samples, grads.v_sigmas.data_ptr<scalar_t>(), grads.v_rgbs.data_ptr<scalar_t>());
  });
  return grads;
}

}  // namespace tessera::kernels::cpu
