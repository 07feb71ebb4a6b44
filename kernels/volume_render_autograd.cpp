// volume_render's entry point: input checks, the torch::autograd::Function that saves what
// backward needs, and the dispatch between the CPU and CUDA implementations.
#include "kernels/volume_render.h"
#include "kernels/device_dispatch.h"

#include <torch/autograd.h>

namespace tessera::kernels {

namespace {

// Shapes, dtypes and devices; the contents of ray_offsets are checked by the implementations.
void check_inputs(const torch::Tensor& sigmas, const torch::Tensor& rgbs,
                  const torch::Tensor& deltas, const torch::Tensor& ts,
                  const torch::Tensor& ray_offsets, double transmittance_threshold) {
  TORCH_CHECK(sigmas.dim() == 1, "volume_render: sigmas must be [S], got ", sigmas.sizes());
  const int64_t num_samples = sigmas.size(0);
  TORCH_CHECK(rgbs.dim() == 2 && rgbs.size(0) == num_samples && rgbs.size(1) == 3,
              "volume_render: rgbs must be [S, 3] with S = ", num_samples, ", got ", rgbs.sizes());
  TORCH_CHECK(deltas.dim() == 1 && deltas.size(0) == num_samples,
              "volume_render: deltas must be [S] with S = ", num_samples, ", got ", deltas.sizes());
  TORCH_CHECK(ts.dim() == 1 && ts.size(0) == num_samples,
              "volume_render: ts must be [S] with S = ", num_samples, ", got ", ts.sizes());
  TORCH_CHECK(ray_offsets.dim() == 1 && ray_offsets.size(0) >= 1,
              "volume_render: ray_offsets must be [R + 1], got ", ray_offsets.sizes());
  TORCH_CHECK(ray_offsets.size(0) > 1 || num_samples == 0,
              "volume_render: ", num_samples, " samples but no rays (ray_offsets has one entry)");
  TORCH_CHECK(ray_offsets.scalar_type() == torch::kInt64,
              "volume_render: ray_offsets must be int64, got ", ray_offsets.scalar_type());
  const auto dtype = sigmas.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat64,
              "volume_render: sigmas must be float32 or float64, got ", dtype);
  for (const torch::Tensor* t : {&rgbs, &deltas, &ts})
    TORCH_CHECK(t->scalar_type() == dtype, "volume_render: rgbs, deltas and ts must have the "
                "dtype of sigmas (", dtype, "), got ", t->scalar_type());
  for (const torch::Tensor* t : {&rgbs, &deltas, &ts, &ray_offsets})
    TORCH_CHECK(t->device() == sigmas.device(), "volume_render: all inputs must be on ",
                sigmas.device(), ", got one on ", t->device());
  TORCH_CHECK(transmittance_threshold >= 0.0 && transmittance_threshold <= 1.0,
              "volume_render: transmittance_threshold must be in [0, 1], got ",
              transmittance_threshold);
}

// Slots in the saved-variable list of VolumeRenderFunction.
enum Saved { kSigmas, kRgbs, kDeltas, kTs, kOffsets, kRgb, kOpacity, kDepth, kWeights, kNumSteps };

}  // namespace

// The autograd wrapper behind volume_render. Outputs, in order: rgb, opacity, depth, weights,
// num_steps. Saved for backward: the inputs, the per-ray outputs and weights (all already
// allocated); per-sample transmittance is recomputed in backward, never stored. Because outputs
// are saved, modifying one in place before backward is an autograd error: composite out of place.
class VolumeRenderFunction : public torch::autograd::Function<VolumeRenderFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& sigmas,       // [S]
      const torch::Tensor& rgbs,         // [S, 3]
      const torch::Tensor& deltas,       // [S]
      const torch::Tensor& ts,           // [S]
      const torch::Tensor& ray_offsets,  // [R + 1]
      double transmittance_threshold);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

torch::autograd::variable_list VolumeRenderFunction::forward(
    torch::autograd::AutogradContext* ctx, const torch::Tensor& sigmas, const torch::Tensor& rgbs,
    const torch::Tensor& deltas, const torch::Tensor& ts, const torch::Tensor& ray_offsets,
    double transmittance_threshold) {
  check_inputs(sigmas, rgbs, deltas, ts, ray_offsets, transmittance_threshold);
  VolumeRenderOutput out;
  out = on_device(
      "volume_render", sigmas,
      [&] {
        return cpu::volume_render_fwd(sigmas, rgbs, deltas, ts, ray_offsets,
                                      transmittance_threshold);
      },
      [&] {
        return cuda::volume_render_fwd(sigmas, rgbs, deltas, ts, ray_offsets,
                                       transmittance_threshold);
      });
  ctx->save_for_backward({sigmas, rgbs, deltas, ts, ray_offsets, out.rgb, out.opacity, out.depth,
                          out.weights, out.num_steps});
  ctx->mark_non_differentiable({out.num_steps});
  // Unused outputs arrive in backward as undefined tensors rather than as allocated zeros.
  ctx->set_materialize_grads(false);
  return {out.rgb, out.opacity, out.depth, out.weights, out.num_steps};
}

torch::autograd::variable_list VolumeRenderFunction::backward(
    torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {
  const torch::autograd::variable_list s = ctx->get_saved_variables();
  const torch::Tensor& v_rgb = grad_outputs[0];
  const torch::Tensor& v_opacity = grad_outputs[1];
  const torch::Tensor& v_depth = grad_outputs[2];
  const torch::Tensor& v_weights = grad_outputs[3];
  VolumeRenderGrads grads;
  grads = on_device(
      "volume_render", s[kSigmas],
      [&] {
        return cpu::volume_render_bwd(s[kSigmas], s[kRgbs], s[kDeltas], s[kTs], s[kOffsets],
                                      s[kRgb], s[kOpacity], s[kDepth], s[kWeights], s[kNumSteps],
                                      v_rgb, v_opacity, v_depth, v_weights);
      },
      [&] {
        return cuda::volume_render_bwd(s[kSigmas], s[kRgbs], s[kDeltas], s[kTs], s[kOffsets],
                                       s[kRgb], s[kOpacity], s[kDepth], s[kWeights], s[kNumSteps],
                                       v_rgb, v_opacity, v_depth, v_weights);
      });
  // One gradient per forward input: sigmas, rgbs, deltas, ts, ray_offsets, threshold.
  return {grads.v_sigmas, grads.v_rgbs, torch::Tensor(), torch::Tensor(), torch::Tensor(),
          torch::Tensor()};
}

VolumeRenderOutput volume_render(const torch::Tensor& sigmas, const torch::Tensor& rgbs,
                                 const torch::Tensor& deltas, const torch::Tensor& ts,
                                 const torch::Tensor& ray_offsets, double transmittance_threshold) {
  if (torch::GradMode::is_enabled())
    TORCH_CHECK(!deltas.requires_grad() && !ts.requires_grad(),
                "volume_render: deltas and ts get no gradient; pass them detached");
  const torch::autograd::variable_list out =
      VolumeRenderFunction::apply(sigmas, rgbs, deltas, ts, ray_offsets, transmittance_threshold);
  return {out[0], out[1], out[2], out[3], out[4]};
}

}  // namespace tessera::kernels
