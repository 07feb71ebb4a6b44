// gaussian_rasterize's entry point: input checks, the torch::autograd::Function that saves what
// backward needs, and the dispatch between the CPU and CUDA implementations.
#include <torch/autograd.h>

#include "kernels/gaussian_rasterize.h"
#include "kernels/device_dispatch.h"

namespace tessera::kernels {

namespace {

void check_inputs(const torch::Tensor& means2d, const torch::Tensor& conics,
                  const torch::Tensor& colors, const torch::Tensor& opacities,
                  const torch::Tensor& background, const torch::Tensor& tile_offsets,
                  const torch::Tensor& gaussian_ids, int64_t width, int64_t height,
                  int64_t tile_size) {
  TORCH_CHECK(means2d.dim() == 2 && means2d.size(1) == 2,
              "rasterize_gaussians: means2d must be [N, 2], got ", means2d.sizes());
  const int64_t n = means2d.size(0);
  TORCH_CHECK(conics.dim() == 2 && conics.size(0) == n && conics.size(1) == 3,
              "rasterize_gaussians: conics must be [N, 3] with N = ", n, ", got ", conics.sizes());
  TORCH_CHECK(colors.dim() == 2 && colors.size(0) == n && colors.size(1) >= 1,
              "rasterize_gaussians: colors must be [N, C] with N = ", n, " and C >= 1, got ",
              colors.sizes());
  const int64_t channels = colors.size(1);
  TORCH_CHECK(opacities.dim() == 1 && opacities.size(0) == n,
              "rasterize_gaussians: opacities must be [N] with N = ", n, ", got ",
              opacities.sizes());
  const auto dtype = means2d.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat64,
              "rasterize_gaussians: means2d must be float32 or float64, got ", dtype);
  for (const torch::Tensor* t : {&conics, &colors, &opacities})
    TORCH_CHECK(t->scalar_type() == dtype, "rasterize_gaussians: conics, colors and opacities "
                "must have the dtype of means2d (", dtype, "), got ", t->scalar_type());
  if (background.defined()) {
    TORCH_CHECK(background.dim() == 1 && background.size(0) == channels,
                "rasterize_gaussians: background must be [C] with C = ", channels, ", got ",
                background.sizes());
    TORCH_CHECK(background.scalar_type() == dtype, "rasterize_gaussians: background must have "
                "the dtype of means2d (", dtype, "), got ", background.scalar_type());
  }
  TORCH_CHECK(width >= 0 && height >= 0,
              "rasterize_gaussians: width and height must be >= 0, got ", width, " x ", height);
  TORCH_CHECK(tile_size >= 1 && tile_size <= (int64_t{1} << 20),
              "rasterize_gaussians: tile_size must be in [1, 2^20], got ", tile_size);
  const int64_t num_tiles = tiles_along(width, tile_size) * tiles_along(height, tile_size);
  TORCH_CHECK(tile_offsets.dim() == 1 && tile_offsets.size(0) == num_tiles + 1,
              "rasterize_gaussians: tile_offsets must be [T + 1] with T = ", num_tiles,
              " for a ", width, " x ", height, " image in tiles of ", tile_size, ", got ",
              tile_offsets.sizes());
  TORCH_CHECK(gaussian_ids.dim() == 1, "rasterize_gaussians: gaussian_ids must be [M], got ",
              gaussian_ids.sizes());
  for (const torch::Tensor* t : {&tile_offsets, &gaussian_ids})
    TORCH_CHECK(t->scalar_type() == torch::kInt64,
                "rasterize_gaussians: tile_offsets and gaussian_ids must be int64, got ",
                t->scalar_type());
  for (const torch::Tensor* t : {&conics, &colors, &opacities, &tile_offsets, &gaussian_ids})
    TORCH_CHECK(t->device() == means2d.device(), "rasterize_gaussians: all inputs must be on ",
                means2d.device(), ", got one on ", t->device());
  if (background.defined())
    TORCH_CHECK(background.device() == means2d.device(),
                "rasterize_gaussians: background must be on ", means2d.device(), ", got ",
                background.device());
}

// Slots in the saved-variable list. The background slot holds an undefined tensor when none.
enum Saved {
  kMeans, kConics, kColors, kOpacities, kBackground, kOffsets, kIds, kLastIds, kTransmittance
};

}  // namespace

// The autograd wrapper behind rasterize_gaussians. Outputs, in order: colors, alphas, last_ids,
// transmittance. Saved for backward: the inputs, last_ids and transmittance (per pixel only).
// Function::apply takes no undefined tensors, so rasterize_gaussians passes zeros [C] (no
// gradient) for a missing background.
class RasterizeGaussiansFunction
    : public torch::autograd::Function<RasterizeGaussiansFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& means2d,       // [N, 2]
      const torch::Tensor& conics,        // [N, 3]
      const torch::Tensor& colors,        // [N, C]
      const torch::Tensor& opacities,     // [N]
      const torch::Tensor& background,    // [C]
      const torch::Tensor& tile_offsets,  // [T + 1]
      const torch::Tensor& gaussian_ids,  // [M]
      int64_t width, int64_t height, int64_t tile_size);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

torch::autograd::variable_list RasterizeGaussiansFunction::forward(
    torch::autograd::AutogradContext* ctx, const torch::Tensor& means2d,
    const torch::Tensor& conics, const torch::Tensor& colors, const torch::Tensor& opacities,
    const torch::Tensor& background, const torch::Tensor& tile_offsets,
    const torch::Tensor& gaussian_ids, int64_t width, int64_t height, int64_t tile_size) {
  check_inputs(means2d, conics, colors, opacities, background, tile_offsets, gaussian_ids, width,
               height, tile_size);
  RasterizeOutput out;
  out = on_device(
      "rasterize_gaussians", means2d,
      [&] {
        return cpu::rasterize_gaussians_fwd(means2d, conics, colors, opacities, background,
                                            tile_offsets, gaussian_ids, width, height, tile_size);
      },
      [&] {
        return cuda::rasterize_gaussians_fwd(means2d, conics, colors, opacities, background,
                                             tile_offsets, gaussian_ids, width, height, tile_size);
      });
  ctx->save_for_backward({means2d, conics, colors, opacities, background, tile_offsets,
                          gaussian_ids, out.last_ids, out.transmittance});
  ctx->saved_data["width"] = width;
  ctx->saved_data["height"] = height;
  ctx->saved_data["tile_size"] = tile_size;
  ctx->mark_non_differentiable({out.last_ids, out.transmittance});
  ctx->set_materialize_grads(false);
  return {out.colors, out.alphas, out.last_ids, out.transmittance};
}

torch::autograd::variable_list RasterizeGaussiansFunction::backward(
    torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {
  const torch::autograd::variable_list s = ctx->get_saved_variables();
  const int64_t width = ctx->saved_data["width"].toInt();
  const int64_t height = ctx->saved_data["height"].toInt();
  const int64_t tile_size = ctx->saved_data["tile_size"].toInt();
  const torch::Tensor& v_colors = grad_outputs[0];
  const torch::Tensor& v_alphas = grad_outputs[1];
  RasterizeGrads g;
  g = on_device(
      "rasterize_gaussians", s[kMeans],
      [&] {
        return cpu::rasterize_gaussians_bwd(s[kMeans], s[kConics], s[kColors], s[kOpacities],
                                            s[kBackground], s[kOffsets], s[kIds], width, height,
                                            tile_size, s[kLastIds], s[kTransmittance], v_colors,
                                            v_alphas);
      },
      [&] {
        return cuda::rasterize_gaussians_bwd(s[kMeans], s[kConics], s[kColors], s[kOpacities],
                                             s[kBackground], s[kOffsets], s[kIds], width, height,
                                             tile_size, s[kLastIds], s[kTransmittance], v_colors,
                                             v_alphas);
      });
  // One gradient per forward input: means2d, conics, colors, opacities, background,
  // tile_offsets, gaussian_ids, width, height, tile_size.
  return {g.v_means2d,      g.v_conics,      g.v_colors,      g.v_opacities,   g.v_background,
          torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
}

RasterizeOutput rasterize_gaussians(const torch::Tensor& means2d, const torch::Tensor& conics,
                                    const torch::Tensor& colors, const torch::Tensor& opacities,
                                    const torch::Tensor& background,
                                    const torch::Tensor& tile_offsets,
                                    const torch::Tensor& gaussian_ids, int64_t width,
                                    int64_t height, int64_t tile_size) {
  // autograd::Function::apply takes no undefined tensors: no background is a constant zero one.
  const torch::Tensor bg = background.defined() || colors.dim() != 2
                               ? background
                               : torch::zeros({colors.size(1)}, means2d.options());
  const torch::autograd::variable_list out = RasterizeGaussiansFunction::apply(
      means2d, conics, colors, opacities, bg, tile_offsets, gaussian_ids, width, height,
      tile_size);
  return {out[0], out[1], out[2], out[3]};
}

torch::Tensor densify_grad_norm(const torch::Tensor& v_means2d, int64_t width, int64_t height) {
  const torch::Tensor scale = torch::tensor({0.5 * static_cast<double>(width),
                                             0.5 * static_cast<double>(height)},
                                            v_means2d.options());
  return (v_means2d * scale).norm(2, {1});  // [N]
}

}  // namespace tessera::kernels
