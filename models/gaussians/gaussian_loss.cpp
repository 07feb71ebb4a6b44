// The 3DGS training loss (see gaussian_loss.h): L1 plus a differentiable SSIM with 'same'
// zero padding, computed in the images' dtype on their device.
#include "models/gaussians/gaussian_loss.h"

#include <stdexcept>

namespace tessera::models::gaussians {
namespace {

constexpr double kSsimC1 = 0.01 * 0.01;  // (K1 L)^2, L = 1: stabilizes the luminance term
constexpr double kSsimC2 = 0.03 * 0.03;  // (K2 L)^2: stabilizes the contrast term

void check_pair(const char* what, const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined() || a.dim() != 3 || a.sizes() != b.sizes() ||
      !a.is_floating_point() || a.scalar_type() != b.scalar_type())
    throw std::invalid_argument(std::string(what) +
                                ": expected two floating images [H, W, C] of one shape and dtype");
}

}  // namespace

torch::Tensor ssim_map(const torch::Tensor& a, const torch::Tensor& b) {
  check_pair("ssim_map", a, b);
  const int64_t c = a.size(2);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64).device(a.device());
  const torch::Tensor x = torch::arange(kSsimWindow, opts) - (kSsimWindow / 2);
  torch::Tensor g = torch::exp(-(x * x) / (2.0 * kSsimSigma * kSsimSigma));
  g = (g / g.sum()).to(a.scalar_type());
  // Depthwise separable filter on [1, C, H, W], zero padding keeps H and W.
  const torch::Tensor gv = g.view({1, 1, kSsimWindow, 1}).repeat({c, 1, 1, 1});
  const torch::Tensor gh = g.view({1, 1, 1, kSsimWindow}).repeat({c, 1, 1, 1});
  const int64_t pad = kSsimWindow / 2;
  auto filt = [&](const torch::Tensor& t) {
    const torch::Tensor v = torch::conv2d(t, gv, torch::Tensor(), torch::IntArrayRef{1, 1},
                                          torch::IntArrayRef{pad, 0}, torch::IntArrayRef{1, 1}, c);
    return torch::conv2d(v, gh, torch::Tensor(), torch::IntArrayRef{1, 1},
                         torch::IntArrayRef{0, pad}, torch::IntArrayRef{1, 1}, c);
  };
  const torch::Tensor xa = a.permute({2, 0, 1}).unsqueeze(0);
  const torch::Tensor xb = b.permute({2, 0, 1}).unsqueeze(0);
  const torch::Tensor mu_a = filt(xa), mu_b = filt(xb);
  const torch::Tensor mu_aa = mu_a * mu_a, mu_bb = mu_b * mu_b, mu_ab = mu_a * mu_b;
  const torch::Tensor var_a = filt(xa * xa) - mu_aa;
  const torch::Tensor var_b = filt(xb * xb) - mu_bb;
  const torch::Tensor cov = filt(xa * xb) - mu_ab;
  const torch::Tensor map = ((2.0 * mu_ab + kSsimC1) * (2.0 * cov + kSsimC2)) /
                            ((mu_aa + mu_bb + kSsimC1) * (var_a + var_b + kSsimC2));
  return map.squeeze(0).permute({1, 2, 0});  // [H, W, C]
}

torch::Tensor ssim_same(const torch::Tensor& a, const torch::Tensor& b) {
  return ssim_map(a, b).mean();
}

torch::Tensor photometric_loss(const torch::Tensor& render, const torch::Tensor& target,
                               double ssim_weight) {
  check_pair("photometric_loss", render, target);
  const torch::Tensor l1 = (render - target).abs().mean();
  return (1.0 - ssim_weight) * l1 + ssim_weight * (1.0 - ssim_same(render, target));
}

}  // namespace tessera::models::gaussians
