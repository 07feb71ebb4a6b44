// ray_march: sample generation for NeRF by marching rays through a binary occupancy grid over the
// scene box (as in instant-ngp and nerfacc). Produces the packed layout volume_render consumes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>

namespace tessera::kernels {

// How a ray is marched. No gradients flow through ray_march: its outputs are sampler outputs.
struct RayMarchParams {
  // Smallest step along the ray (the step everywhere when cone_angle == 0), in units of t.
  float step_size = 0.0f;
  // Cone tracing: dt = clamp(t * cone_angle, step_size, max_step); 0 gives constant steps.
  // instant-ngp uses 1/256 for unbounded scenes; bounded (synthetic) scenes use 0.
  float cone_angle = 0.0f;
  // Upper bound of dt under cone tracing (>= step_size); ignored when cone_angle == 0.
  float max_step = std::numeric_limits<float>::infinity();
  // Samples kept per ray at most; marching stops once a ray has this many.
  int64_t max_samples_per_ray = 1024;
  // Unbounded scenes (mip-NeRF 360's scene contraction, L-inf as in nerfacto): the occupancy grid
  // covers the contracted space [-2, 2]^3 instead of the aabb. A point p is looked up at
  // contract(p) = p where |p|_inf <= 1, else (2 - 1 / |p|_inf) p / |p|_inf, so the grid is fine
  // around the foreground [-1, 1]^3 and ever coarser (in world units) out to infinity. The aabb
  // then only clips the rays (pass the whole extent the cameras see).
  bool contract = false;
};

// Packed samples: ray r owns samples [ray_offsets[r], ray_offsets[r+1]), in increasing t.
// ts, deltas and ray_offsets go straight into volume_render (kernels/volume_render.h).
struct RayMarchOutput {
  at::Tensor ray_offsets;  // [R + 1] int64, ray_offsets[0] == 0, ray_offsets[R] == S
  at::Tensor ts;           // [S]     float32, sample midpoints t + dt / 2
  at::Tensor deltas;       // [S]     float32, the step dt of each sample
  at::Tensor positions;    // [S, 3]  float32, origin + ts * direction (the point looked up)
  at::Tensor ray_indices;  // [S]     int64, the ray of each sample
};

// The rule, per ray, in float32 with every operation rounded once (no fused multiply-add), so
// that the CPU and CUDA implementations give bitwise identical samples:
//  1. t is the ray parameter: a point is origin + t * direction, with direction as given (not
//     normalized). Pass unit directions to make t, deltas and step_size distances, which is what
//     volume_render's sigma * delta needs.
//  2. Box: per axis a with d_a != 0, the slab is t in [(lo_a - o_a) / d_a, (hi_a - o_a) / d_a]
//     (ends sorted); with d_a == 0 the slab is all t if lo_a <= o_a <= hi_a, else the ray misses
//     (no 0 * inf NaN). t_enter / t_exit are the max / min of the slab ends.
//  3. t_start = max(near, t_enter), t_end = min(far, t_exit). No samples unless t_start < t_end.
//  4. t = t_start; repeat: dt = step(t) (step_size, or the cone clamp above); t_next = t + dt;
//     stop if t_next > t_end (the last partial step is dropped) or t_next == t (no progress left
//     in float); t_mid = t + 0.5 * dt; keep (t_mid, dt) if the cell holding origin + t_mid * dir
//     is occupied; stop once max_samples_per_ray are kept; t = t_next.
//     With constant dt and exact arithmetic a fully occupied box gives floor((t_end - t_start)/dt)
//     samples; in float, t accumulates by repeated addition, as in instant-ngp.
//  5. Cell of a point p (of contract(p) with params.contract, the grid then spanning [-2, 2]^3;
//     contract computes m = max_a |p_a| and, when m > 1, s = (2 - 1 / m) / m and p_a * s):
//     c_a = clamp(floor((p_a - lo_a) * (G_a / (hi_a - lo_a))), 0, G_a - 1),
//     where G_a / (hi_a - lo_a) is computed once in float. Occupancy is indexed [x][y][z]:
//     occupancy[c_x][c_y][c_z] != 0 means occupied (instant-ngp stores Morton order; convert).
// Rays with a non-finite origin or direction component, a zero direction, or a NaN near or far
// get no samples.
//
// Dispatches by the device of origins (CPU or CUDA). The aabb is read on the host (any device).
RayMarchOutput ray_march(
    const at::Tensor& origins,     // [R, 3] float32
    const at::Tensor& directions,  // [R, 3] float32, any length (see 1.)
    const at::Tensor& near,        // [R]    float32
    const at::Tensor& far,         // [R]    float32
    const at::Tensor& aabb,        // [6]    float32: xmin, ymin, zmin, xmax, ymax, zmax
    const at::Tensor& occupancy,   // [Gx, Gy, Gz] uint8 or bool, indexed [x][y][z]
    const RayMarchParams& params);

// The two implementations take the same arguments and return the same tensors. They expect
// inputs validated by ray_march (shapes, dtypes, devices, a finite box with lo < hi, positive
// step sizes), aabb on the CPU, and accept any strides. Two passes over the rays: count the
// samples of each ray, exclusive scan into ray_offsets, then march again to fill.
namespace cpu {
RayMarchOutput ray_march_fwd(
    const at::Tensor& origins,     // [R, 3]
    const at::Tensor& directions,  // [R, 3]
    const at::Tensor& near,        // [R]
    const at::Tensor& far,         // [R]
    const at::Tensor& aabb,        // [6] on the CPU
    const at::Tensor& occupancy,   // [Gx, Gy, Gz]
    const RayMarchParams& params);
}  // namespace cpu

namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA). One thread per ray; the current stream.
// Reading the sample count S back to size the outputs synchronizes with the stream once.
RayMarchOutput ray_march_fwd(
    const at::Tensor& origins,     // [R, 3]
    const at::Tensor& directions,  // [R, 3]
    const at::Tensor& near,        // [R]
    const at::Tensor& far,         // [R]
    const at::Tensor& aabb,        // [6] on the CPU
    const at::Tensor& occupancy,   // [Gx, Gy, Gz]
    const RayMarchParams& params);
}  // namespace cuda

}  // namespace tessera::kernels
