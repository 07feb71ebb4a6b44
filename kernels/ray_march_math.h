// Math shared by the CPU and CUDA ray_march: the marching rule of kernels/ray_march.h for one ray,
// in float32 rounded once per operation (kernels/host_device.h), so that both implementations
// keep the same samples bit for bit and the CPU tests cover the arithmetic the GPU runs. The
// callers own the rest: the two passes (count, then fill at the scanned offsets) over the rays,
// CPU tasks or one CUDA thread per ray.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/ray_march.h"

namespace tessera::kernels::march {

// The box and grid as the marching loop uses them; scale is G / (hi - lo), rounded once.
struct Grid {
  float lo[3], hi[3];          // the clipping box
  float cell_lo[3], scale[3];  // the grid's lower corner and G / extent (contracted: -2, G / 4)
  int64_t res[3];
  const uint8_t* occupied;     // [Gx, Gy, Gz] contiguous, nonzero = occupied (on the device: CUDA)
};

// The grid of box = aabb [6] (on the host) over `res` cells; `occupied` is set by the caller.
inline Grid make_grid(const float* box, const int64_t* res, bool contract) {
  Grid g;
  for (int a = 0; a < 3; ++a) {
    g.lo[a] = box[a];
    g.hi[a] = box[a + 3];
    g.res[a] = res[a];
    // Contracted space spans [-2, 2]: the grid's cells divide that, the aabb only clips.
    const float cell_lo = contract ? -2.0f : g.lo[a], cell_hi = contract ? 2.0f : g.hi[a];
    g.cell_lo[a] = cell_lo;
    g.scale[a] = static_cast<float>(g.res[a]) / (cell_hi - cell_lo);
  }
  g.occupied = nullptr;
  return g;
}

// False for NaN and the infinities (x - x is NaN for both), without a library call.
TESSERA_HD inline bool is_finite(float x) { return x - x == 0.0f; }

// Index of the cell containing p_a along axis a, clamped into the grid (points on the far face
// and rounding just outside the box fall into the border cell).
TESSERA_HD inline int64_t cell_of(float p, int a, const Grid& g) {
  const float v = hd_mul_rn(hd_sub_rn(p, g.cell_lo[a]), g.scale[a]);
  if (!(v > 0.0f)) return 0;
  if (v >= static_cast<float>(g.res[a])) return g.res[a] - 1;
  return static_cast<int64_t>(v);
}

// Marches one ray by the rule in kernels/ray_march.h and calls emit(k, t_mid, dt, px, py, pz) for
// the k-th kept sample. Returns the number of kept samples.
template <typename Emit>
TESSERA_HD inline int64_t march_ray(const float* o, const float* d, float near, float far,
                                    const Grid& g, float step_size, float cone_angle,
                                    float max_step, bool contract, int64_t max_samples,
                                    Emit&& emit) {
  if (max_samples == 0 || near != near || far != far) return 0;
  for (int a = 0; a < 3; ++a)
    if (!is_finite(o[a]) || !is_finite(d[a])) return 0;
  if (d[0] == 0.0f && d[1] == 0.0f && d[2] == 0.0f) return 0;
  float t_enter = -INFINITY, t_exit = INFINITY;
  for (int a = 0; a < 3; ++a) {
    if (d[a] == 0.0f) {
      if (!(g.lo[a] <= o[a] && o[a] <= g.hi[a])) return 0;
      continue;
    }
    const float t0 = hd_div_rn(hd_sub_rn(g.lo[a], o[a]), d[a]);
    const float t1 = hd_div_rn(hd_sub_rn(g.hi[a], o[a]), d[a]);
    const float lo = t0 < t1 ? t0 : t1, hi = t0 < t1 ? t1 : t0;
    if (lo > t_enter) t_enter = lo;
    if (hi < t_exit) t_exit = hi;
  }
  const float t_start = near > t_enter ? near : t_enter;
  const float t_end = far < t_exit ? far : t_exit;
  if (!(t_start < t_end)) return 0;

  const bool cone = cone_angle > 0.0f;
  int64_t kept = 0;
  float t = t_start;
  while (true) {
    float dt = step_size;
    if (cone) {
      dt = hd_mul_rn(t, cone_angle);
      if (dt < step_size) dt = step_size;
      if (dt > max_step) dt = max_step;
    }
    const float t_next = hd_add_rn(t, dt);
    if (t_next > t_end || t_next == t) break;
    const float t_mid = hd_add_rn(t, hd_mul_rn(0.5f, dt));
    const float px = hd_add_rn(o[0], hd_mul_rn(t_mid, d[0]));
    const float py = hd_add_rn(o[1], hd_mul_rn(t_mid, d[1]));
    const float pz = hd_add_rn(o[2], hd_mul_rn(t_mid, d[2]));
    float qx = px, qy = py, qz = pz;  // where the grid is looked up
    if (contract) {
      const float ax = qx < 0.0f ? -qx : qx, ay = qy < 0.0f ? -qy : qy, az = qz < 0.0f ? -qz : qz;
      const float m = ax > ay ? (ax > az ? ax : az) : (ay > az ? ay : az);
      if (m > 1.0f) {
        const float s = hd_div_rn(hd_sub_rn(2.0f, hd_div_rn(1.0f, m)), m);
        qx = hd_mul_rn(qx, s), qy = hd_mul_rn(qy, s), qz = hd_mul_rn(qz, s);
      }
    }
    const int64_t cell =
        (cell_of(qx, 0, g) * g.res[1] + cell_of(qy, 1, g)) * g.res[2] + cell_of(qz, 2, g);
    if (g.occupied[cell]) {
      emit(kept, t_mid, dt, px, py, pz);
      if (++kept == max_samples) break;
    }
    t = t_next;
  }
  return kept;
}

// The emit of the fill pass: the k-th kept sample of ray `ray` goes to row base + k.
struct SampleWriter {
  float* ts;              // [S]
  float* deltas;          // [S]
  float* positions;       // [S, 3]
  int64_t* ray_indices;   // [S]
  int64_t base, ray;
  TESSERA_HD void operator()(int64_t k, float t_mid, float dt, float px, float py,
                             float pz) const {
    const int64_t i = base + k;
    ts[i] = t_mid;
    deltas[i] = dt;
    positions[3 * i + 0] = px;
    positions[3 * i + 1] = py;
    positions[3 * i + 2] = pz;
    ray_indices[i] = ray;
  }
};

// march_ray with the parameters of `p`.
template <typename Emit>
TESSERA_HD inline int64_t march_ray(const float* o, const float* d, float near, float far,
                                    const Grid& g, const RayMarchParams& p, Emit&& emit) {
  return march_ray(o, d, near, far, g, p.step_size, p.cone_angle, p.max_step, p.contract,
                   p.max_samples_per_ray, emit);
}

}  // namespace tessera::kernels::march
