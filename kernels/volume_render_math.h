// Math shared by the CPU and CUDA volume_render: the front-to-back compositing of one ray and its
// reverse, so that the CPU tests cover the arithmetic the GPU runs. The callers own the rest: the
// CPU takes rays in parallel tasks and computes every exp(-sigma delta) first, vectorized; CUDA
// runs one thread per ray and computes each in the loop. `survive(i)` gives exp(-sigma_i delta_i)
// (1 - alpha) either way; the offsets are checked by the callers.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace tessera::kernels::volume_math {

// What compositing one ray gives.
template <typename T>
struct RayColor {
  T rgb[3] = {0, 0, 0};
  T opacity = 0;
  T depth = 0;
  int64_t steps = 0;  // samples composited before transmittance fell below the threshold
};

// Composites samples [first, last): w_i = T_i (1 - survive_i), T_{i+1} = T_i survive_i, stopping
// after the sample whose transmittance falls below `threshold`. Writes weights[i] for every sample
// of the ray (0 after the stop). survive(i) is read before weights[i] is written, so the caller
// may keep the survivals in `weights`.
template <typename T, typename Survive>
TESSERA_HD inline RayColor<T> composite_ray(int64_t first, int64_t last, T threshold,
                                            Survive survive,
                                            const T* __restrict__ rgbs,  // [S, 3]
                                            const T* __restrict__ ts,    // [S]
                                            T* weights) {  // [S], may hold the survivals
  RayColor<T> c;
  T transmittance = 1;
  int64_t i = first;
  while (i < last) {
    const T s = survive(i);
    const T w = transmittance * (1 - s);
    weights[i] = w;
    c.rgb[0] += w * rgbs[3 * i + 0];
    c.rgb[1] += w * rgbs[3 * i + 1];
    c.rgb[2] += w * rgbs[3 * i + 2];
    c.depth += w * ts[i];
    c.opacity += w;
    transmittance *= s;
    ++i;
    if (transmittance < threshold) break;
  }
  c.steps = i - first;
  for (; i < last; ++i) weights[i] = 0;
  return c;
}

// Stores ray `ray`'s outputs.
template <typename T>
TESSERA_HD inline void store_ray(const RayColor<T>& c, int64_t ray, T* out_rgb, T* out_opacity,
                                 T* out_depth, int64_t* out_num_steps) {
  out_num_steps[ray] = c.steps;
  out_rgb[3 * ray + 0] = c.rgb[0];
  out_rgb[3 * ray + 1] = c.rgb[1];
  out_rgb[3 * ray + 2] = c.rgb[2];
  out_opacity[ray] = c.opacity;
  out_depth[ray] = c.depth;
}

// The incoming gradients of one ray's outputs (zero where an output got none).
template <typename T>
struct RayCotangent {
  T rgb[3] = {0, 0, 0};
  T opacity = 0;
  T depth = 0;
};

// The reverse of composite_ray over samples [first, stop) (stop = first + steps; the samples
// after it get zero gradients up to `last`). With g_i = v_rgb . rgb_i + v_opacity + v_depth t_i +
// v_weights_i, the gradient of the loss with respect to w_i, and L = sum_i w_i g_i:
//   dL/dsigma_i = delta_i (T_{i+1} g_i - sum_{j > i} w_j g_j),   dL/drgb_i = w_i v_rgb,
// where the suffix sum is total - prefix and the total comes from the saved ray outputs (and the
// saved weights for the v_weights term). survive(i) is read before v_sigmas[i] is written.
template <typename T, typename Survive>
TESSERA_HD inline void backprop_ray(int64_t first, int64_t stop, int64_t last, Survive survive,
                                    const RayCotangent<T>& v, const T saved_rgb[3],
                                    T saved_opacity, T saved_depth,
                                    const T* __restrict__ rgbs,       // [S, 3]
                                    const T* __restrict__ deltas,     // [S]
                                    const T* __restrict__ ts,         // [S]
                                    const T* __restrict__ weights,    // [S] (saved)
                                    const T* __restrict__ v_weights,  // [S] or null
                                    T* v_sigmas,  // [S], may hold the survivals
                                    T* __restrict__ v_rgbs) {         // [S, 3]
  T total = v.rgb[0] * saved_rgb[0] + v.rgb[1] * saved_rgb[1] + v.rgb[2] * saved_rgb[2] +
            v.opacity * saved_opacity + v.depth * saved_depth;
  if (v_weights)
    for (int64_t i = first; i < stop; ++i) total += v_weights[i] * weights[i];

  T transmittance = 1, prefix = 0;
  for (int64_t i = first; i < stop; ++i) {
    const T s = survive(i);
    const T w = transmittance * (1 - s);
    transmittance *= s;  // now T_{i+1}
    const T g_i = v.rgb[0] * rgbs[3 * i + 0] + v.rgb[1] * rgbs[3 * i + 1] +
                  v.rgb[2] * rgbs[3 * i + 2] + v.opacity + v.depth * ts[i] +
                  (v_weights ? v_weights[i] : T{0});
    prefix += w * g_i;
    v_sigmas[i] = deltas[i] * (transmittance * g_i - (total - prefix));
    v_rgbs[3 * i + 0] = w * v.rgb[0];
    v_rgbs[3 * i + 1] = w * v.rgb[1];
    v_rgbs[3 * i + 2] = w * v.rgb[2];
  }
  for (int64_t i = stop; i < last; ++i) {
    v_sigmas[i] = 0;
    v_rgbs[3 * i + 0] = 0;
    v_rgbs[3 * i + 1] = 0;
    v_rgbs[3 * i + 2] = 0;
  }
}

// The cotangent of ray `ray` from the optional incoming gradients (null: zero).
template <typename T>
TESSERA_HD inline RayCotangent<T> ray_cotangent(int64_t ray, const T* v_rgb, const T* v_opacity,
                                                const T* v_depth) {
  RayCotangent<T> v;
  if (v_rgb) {
    v.rgb[0] = v_rgb[3 * ray + 0];
    v.rgb[1] = v_rgb[3 * ray + 1];
    v.rgb[2] = v_rgb[3 * ray + 2];
  }
  if (v_opacity) v.opacity = v_opacity[ray];
  if (v_depth) v.depth = v_depth[ray];
  return v;
}

}  // namespace tessera::kernels::volume_math
