// project_gaussians' entry point: input checks, the torch::autograd::Function that saves what
// backward needs, and the dispatch between the CPU and CUDA implementations.
#include "kernels/gaussian_projection.h"
#include "kernels/device_dispatch.h"

#include <torch/autograd.h>

namespace tessera::kernels {

namespace {

void check_inputs(const torch::Tensor& means, const torch::Tensor& quats,
                  const torch::Tensor& scales, const torch::Tensor& viewmat,
                  const ProjectionCamera& cam) {
  TORCH_CHECK(means.dim() == 2 && means.size(1) == 3,
              "project_gaussians: means must be [N, 3], got ", means.sizes());
  const int64_t n = means.size(0);
  TORCH_CHECK(quats.dim() == 2 && quats.size(0) == n && quats.size(1) == 4,
              "project_gaussians: quats must be [N, 4] with N = ", n, ", got ", quats.sizes());
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == n && scales.size(1) == 3,
              "project_gaussians: scales must be [N, 3] with N = ", n, ", got ", scales.sizes());
  TORCH_CHECK(viewmat.dim() == 2 && viewmat.size(0) == 4 && viewmat.size(1) == 4,
              "project_gaussians: viewmat must be [4, 4], got ", viewmat.sizes());
  const auto dtype = means.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat64,
              "project_gaussians: means must be float32 or float64, got ", dtype);
  for (const torch::Tensor* t : {&quats, &scales, &viewmat})
    TORCH_CHECK(t->scalar_type() == dtype, "project_gaussians: quats, scales and viewmat must "
                "have the dtype of means (", dtype, "), got ", t->scalar_type());
  for (const torch::Tensor* t : {&quats, &scales, &viewmat})
    TORCH_CHECK(t->device() == means.device(), "project_gaussians: all inputs must be on ",
                means.device(), ", got one on ", t->device());
  TORCH_CHECK(cam.fx > 0 && cam.fy > 0, "project_gaussians: fx and fy must be > 0, got ",
              cam.fx, " and ", cam.fy);
  TORCH_CHECK(cam.width > 0 && cam.height > 0,
              "project_gaussians: width and height must be > 0, got ", cam.width, " and ",
              cam.height);
  TORCH_CHECK(cam.near_plane > 0 && cam.far_plane > cam.near_plane,
              "project_gaussians: need 0 < near_plane < far_plane, got ", cam.near_plane, " and ",
              cam.far_plane);
  TORCH_CHECK(cam.eps2d >= 0, "project_gaussians: eps2d must be >= 0, got ", cam.eps2d);
}

// Slots in the saved-variable list of ProjectGaussiansFunction.
enum Saved { kMeans, kQuats, kScales, kViewmat, kRadii };

// The camera is kept in ctx->saved_data under these keys.
constexpr const char* kCameraKeys[] = {"fx", "fy", "cx", "cy", "near", "far", "eps2d"};

}  // namespace

// The autograd wrapper behind project_gaussians. Outputs, in order: radii, means2d, depths,
// conics. Saved for backward: the inputs and radii (the cull decision); everything else is
// recomputed per Gaussian in backward.
class ProjectGaussiansFunction : public torch::autograd::Function<ProjectGaussiansFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& means,    // [N, 3]
      const torch::Tensor& quats,    // [N, 4]
      const torch::Tensor& scales,   // [N, 3]
      const torch::Tensor& viewmat,  // [4, 4]
      double fx, double fy, double cx, double cy, int64_t width, int64_t height,
      double near_plane, double far_plane, double eps2d);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

torch::autograd::variable_list ProjectGaussiansFunction::forward(
    torch::autograd::AutogradContext* ctx, const torch::Tensor& means, const torch::Tensor& quats,
    const torch::Tensor& scales, const torch::Tensor& viewmat, double fx, double fy, double cx,
    double cy, int64_t width, int64_t height, double near_plane, double far_plane, double eps2d) {
  const ProjectionCamera cam{fx, fy, cx, cy, width, height, near_plane, far_plane, eps2d};
  check_inputs(means, quats, scales, viewmat, cam);
  ProjectionOutput out;
  out = on_device(
      "project_gaussians", means,
      [&] { return cpu::project_gaussians_fwd(means, quats, scales, viewmat, cam); },
      [&] { return cuda::project_gaussians_fwd(means, quats, scales, viewmat, cam); });
  ctx->save_for_backward({means, quats, scales, viewmat, out.radii});
  const double values[] = {fx, fy, cx, cy, near_plane, far_plane, eps2d};
  for (int i = 0; i < 7; ++i) ctx->saved_data[kCameraKeys[i]] = values[i];
  ctx->saved_data["width"] = width;
  ctx->saved_data["height"] = height;
  ctx->mark_non_differentiable({out.radii});
  // Unused outputs arrive in backward as undefined tensors rather than as allocated zeros.
  ctx->set_materialize_grads(false);
  return {out.radii, out.means2d, out.depths, out.conics};
}

torch::autograd::variable_list ProjectGaussiansFunction::backward(
    torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {
  const torch::autograd::variable_list s = ctx->get_saved_variables();
  double values[7];
  for (int i = 0; i < 7; ++i) values[i] = ctx->saved_data[kCameraKeys[i]].toDouble();
  const ProjectionCamera cam{values[0], values[1], values[2],
                             values[3], ctx->saved_data["width"].toInt(),
                             ctx->saved_data["height"].toInt(), values[4],
                             values[5], values[6]};
  const torch::Tensor& v_means2d = grad_outputs[1];
  const torch::Tensor& v_depths = grad_outputs[2];
  const torch::Tensor& v_conics = grad_outputs[3];
  ProjectionGrads grads;
  grads = on_device(
      "project_gaussians", s[kMeans],
      [&] {
        return cpu::project_gaussians_bwd(s[kMeans], s[kQuats], s[kScales], s[kViewmat], cam,
                                          s[kRadii], v_means2d, v_depths, v_conics);
      },
      [&] {
        return cuda::project_gaussians_bwd(s[kMeans], s[kQuats], s[kScales], s[kViewmat], cam,
                                           s[kRadii], v_means2d, v_depths, v_conics);
      });
  // One gradient per forward input: means, quats, scales, viewmat, then the 9 numbers.
  torch::autograd::variable_list result(13);
  result[0] = grads.v_means;
  result[1] = grads.v_quats;
  result[2] = grads.v_scales;
  return result;
}

ProjectionOutput project_gaussians(const torch::Tensor& means, const torch::Tensor& quats,
                                   const torch::Tensor& scales, const torch::Tensor& viewmat,
                                   double fx, double fy, double cx, double cy, int64_t width,
                                   int64_t height, double near_plane, double far_plane,
                                   double eps2d) {
  if (torch::GradMode::is_enabled())
    TORCH_CHECK(!viewmat.requires_grad(),
                "project_gaussians: viewmat gets no gradient; pass it detached");
  const torch::autograd::variable_list out = ProjectGaussiansFunction::apply(
      means, quats, scales, viewmat, fx, fy, cx, cy, width, height, near_plane, far_plane, eps2d);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace tessera::kernels
