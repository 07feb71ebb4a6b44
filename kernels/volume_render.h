// volume_render: emission-absorption compositing of packed ray samples (as in nerfacc and
// instant-ngp) into ray colour, opacity, depth and per-sample weights, with early termination.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::kernels {

// Early termination: a ray stops accumulating once its transmittance falls below this. At 1e-4
// the samples left out could add at most 1e-4 to opacity (below 8-bit colour resolution, 1/255),
// and they are most of the samples behind an opaque surface. 0 turns termination off.
constexpr double kDefaultTransmittanceThreshold = 1e-4;

// Per ray r and its samples i in order, with T = 1 at the start of the ray:
//   alpha_i = 1 - exp(-sigma_i * delta_i);   w_i = T * alpha_i;   T *= (1 - alpha_i);
//   rgb_r += w_i * rgb_i;   depth_r += w_i * t_i;   opacity_r += w_i;
//   then, if T < transmittance_threshold, the ray stops: later samples get w = 0 and no gradient.
// Background compositing is the caller's: rgb + (1 - opacity) * background.
struct VolumeRenderOutput {
  // The four float outputs are differentiable; num_steps is not.
  at::Tensor rgb;        // [R, 3] composited colour
  at::Tensor opacity;    // [R]    sum of the ray's weights, in [0, 1]
  at::Tensor depth;      // [R]    sum of w_i * t_i (depth / opacity is the expected t)
  at::Tensor weights;    // [S]    w_i; 0 after the ray stopped
  at::Tensor num_steps;  // [R]    int64: samples composited before the ray stopped
};

// The differentiable op. Dispatches to the CPU or the CUDA implementation by the inputs' device.
//   sigmas, rgbs, deltas, ts: one floating dtype (float32 or float64), one device, any strides.
//   ray_offsets: int64; ray r owns samples [ray_offsets[r], ray_offsets[r+1]); monotone,
//   ray_offsets[0] == 0 and ray_offsets[R] == S (checked on CPU; a device assert on CUDA).
// Gradients flow to sigmas and rgbs from all four float outputs. deltas and ts are sampler
// outputs and get no gradient: passing them with requires_grad (in grad mode) is an error.
VolumeRenderOutput volume_render(
    const at::Tensor& sigmas,       // [S]    densities, >= 0 (after the model's activation)
    const at::Tensor& rgbs,         // [S, 3] sample colours
    const at::Tensor& deltas,       // [S]    segment lengths
    const at::Tensor& ts,           // [S]    sample distances along the ray (for depth)
    const at::Tensor& ray_offsets,  // [R + 1] int64
    double transmittance_threshold = kDefaultTransmittanceThreshold);

// Gradients of the backward pass.
struct VolumeRenderGrads {
  at::Tensor v_sigmas;  // [S]
  at::Tensor v_rgbs;    // [S, 3]
};

// The two implementations take the same arguments and return the same tensors. They expect
// inputs validated by volume_render (shapes, one float dtype, one device) and accept any strides.
// Accumulation is in the inputs' dtype (float32 or float64). In backward, an undefined grad
// output counts as zero; the per-ray totals come from the saved outputs (rgb, opacity, depth;
// weights only when v_weights is defined) and the ray's transmittance is recomputed for the
// num_steps composited samples; later samples get zero gradient.
namespace cpu {
VolumeRenderOutput volume_render_fwd(
    // forward inputs
    const at::Tensor& sigmas,       // [S]
    const at::Tensor& rgbs,         // [S, 3]
    const at::Tensor& deltas,       // [S]
    const at::Tensor& ts,           // [S]
    const at::Tensor& ray_offsets,  // [R + 1] int64
    double transmittance_threshold);

VolumeRenderGrads volume_render_bwd(
    // forward inputs
    const at::Tensor& sigmas,       // [S]
    const at::Tensor& rgbs,         // [S, 3]
    const at::Tensor& deltas,       // [S]
    const at::Tensor& ts,           // [S]
    const at::Tensor& ray_offsets,  // [R + 1] int64
    // forward outputs
    const at::Tensor& rgb,          // [R, 3]
    const at::Tensor& opacity,      // [R]
    const at::Tensor& depth,        // [R]
    const at::Tensor& weights,      // [S]
    const at::Tensor& num_steps,    // [R] int64
    // grad outputs (each may be undefined)
    const at::Tensor& v_rgb,        // [R, 3]
    const at::Tensor& v_opacity,    // [R]
    const at::Tensor& v_depth,      // [R]
    const at::Tensor& v_weights);   // [S]
}  // namespace cpu

namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA). One thread per ray; the current stream.
VolumeRenderOutput volume_render_fwd(
    // forward inputs
    const at::Tensor& sigmas,       // [S]
    const at::Tensor& rgbs,         // [S, 3]
    const at::Tensor& deltas,       // [S]
    const at::Tensor& ts,           // [S]
    const at::Tensor& ray_offsets,  // [R + 1] int64
    double transmittance_threshold);

VolumeRenderGrads volume_render_bwd(
    // forward inputs
    const at::Tensor& sigmas,       // [S]
    const at::Tensor& rgbs,         // [S, 3]
    const at::Tensor& deltas,       // [S]
    const at::Tensor& ts,           // [S]
    const at::Tensor& ray_offsets,  // [R + 1] int64
    // forward outputs
    const at::Tensor& rgb,          // [R, 3]
    const at::Tensor& opacity,      // [R]
    const at::Tensor& depth,        // [R]
    const at::Tensor& weights,      // [S]
    const at::Tensor& num_steps,    // [R] int64
    // grad outputs (each may be undefined)
    const at::Tensor& v_rgb,        // [R, 3]
    const at::Tensor& v_opacity,    // [R]
    const at::Tensor& v_depth,      // [R]
    const at::Tensor& v_weights);   // [S]
}  // namespace cuda

}  // namespace tessera::kernels
