// spherical_harmonics' entry point: input checks, the torch::autograd::Function that saves what
// backward needs, and the dispatch between the CPU and CUDA implementations.
#include "kernels/spherical_harmonics.h"
#include "kernels/device_dispatch.h"

#include <torch/autograd.h>

namespace tessera::kernels {

namespace {

void check_inputs(int64_t degree, const torch::Tensor& dirs, const torch::Tensor& dc,
                  const torch::Tensor& rest) {
  TORCH_CHECK(degree >= 0 && degree <= kMaxShDegree, "spherical_harmonics: degree must be in [0, ",
              kMaxShDegree, "], got ", degree);
  TORCH_CHECK(dirs.dim() == 2 && dirs.size(1) == 3,
              "spherical_harmonics: dirs must be [N, 3], got ", dirs.sizes());
  const int64_t n = dirs.size(0);
  TORCH_CHECK(dc.dim() == 3 && dc.size(0) == n && dc.size(1) == 1 && dc.size(2) == 3,
              "spherical_harmonics: dc must be [N, 1, 3] with N = ", n, ", got ", dc.sizes());
  TORCH_CHECK(rest.dim() == 3 && rest.size(0) == n && rest.size(2) == 3,
              "spherical_harmonics: rest must be [N, K - 1, 3] with N = ", n, ", got ",
              rest.sizes());
  const int64_t k = rest.size(1) + 1;
  TORCH_CHECK(k == 1 || k == 4 || k == 9 || k == 16,
              "spherical_harmonics: coeffs must hold K = (max_degree + 1)^2 in {1, 4, 9, 16} "
              "coefficients per channel, got K = ", k);
  TORCH_CHECK(k >= (degree + 1) * (degree + 1), "spherical_harmonics: degree ", degree,
              " needs K >= ", (degree + 1) * (degree + 1), " coefficients, got K = ", k);
  const auto dtype = dirs.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat64,
              "spherical_harmonics: dirs must be float32 or float64, got ", dtype);
  TORCH_CHECK(dc.scalar_type() == dtype && rest.scalar_type() == dtype,
              "spherical_harmonics: coeffs must have the dtype of dirs (", dtype, "), got ",
              dc.scalar_type(), " and ", rest.scalar_type());
  TORCH_CHECK(dc.device() == dirs.device() && rest.device() == dirs.device(),
              "spherical_harmonics: coeffs must be on ", dirs.device(), ", got ", dc.device(),
              " and ", rest.device());
}

}  // namespace

// The autograd wrapper behind spherical_harmonics. Output: colors. Saved for backward: the
// inputs (the basis and the clamp are recomputed per Gaussian).
class SphericalHarmonicsFunction : public torch::autograd::Function<SphericalHarmonicsFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, int64_t degree,
      const torch::Tensor& dirs,   // [N, 3]
      const torch::Tensor& dc,     // [N, 1, 3]
      const torch::Tensor& rest);  // [N, K - 1, 3]
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

torch::autograd::variable_list SphericalHarmonicsFunction::forward(
    torch::autograd::AutogradContext* ctx, int64_t degree, const torch::Tensor& dirs,
    const torch::Tensor& dc, const torch::Tensor& rest) {
  check_inputs(degree, dirs, dc, rest);
  torch::Tensor colors;
  colors = on_device(
      "spherical_harmonics", dirs,
      [&] { return cpu::spherical_harmonics_fwd(degree, dirs, dc, rest); },
      [&] { return cuda::spherical_harmonics_fwd(degree, dirs, dc, rest); });
  ctx->save_for_backward({dirs, dc, rest});
  ctx->saved_data["degree"] = degree;
  return {colors};
}

torch::autograd::variable_list SphericalHarmonicsFunction::backward(
    torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {
  const torch::autograd::variable_list s = ctx->get_saved_variables();
  const int64_t degree = ctx->saved_data["degree"].toInt();
  const torch::Tensor& v_colors = grad_outputs[0];  // materialized: defined
  SphericalHarmonicsGrads grads;
  grads = on_device(
      "spherical_harmonics", s[0],
      [&] { return cpu::spherical_harmonics_bwd(degree, s[0], s[1], s[2], v_colors); },
      [&] { return cuda::spherical_harmonics_bwd(degree, s[0], s[1], s[2], v_colors); });
  // One gradient per forward input: degree, dirs, dc, rest.
  return {torch::Tensor(), grads.v_dirs, grads.v_dc, grads.v_rest};
}

torch::Tensor spherical_harmonics(int64_t degree, const torch::Tensor& dirs,
                                  const torch::Tensor& dc, const torch::Tensor& rest) {
  return SphericalHarmonicsFunction::apply(degree, dirs, dc, rest)[0];
}

torch::Tensor spherical_harmonics(int64_t degree, const torch::Tensor& dirs,
                                  const torch::Tensor& coeffs) {
  TORCH_CHECK(coeffs.dim() == 3 && coeffs.size(1) >= 1,
              "spherical_harmonics: coeffs must be [N, K, 3] with K >= 1, got ", coeffs.sizes());
  return spherical_harmonics(degree, dirs, coeffs.narrow(1, 0, 1),
                             coeffs.narrow(1, 1, coeffs.size(1) - 1));
}

}  // namespace tessera::kernels
