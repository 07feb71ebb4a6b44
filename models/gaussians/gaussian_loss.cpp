// The 3DGS training loss (see gaussian_loss.h): L1 plus a differentiable SSIM with 'same'
// zero padding, computed in the images' dtype on their device.
#include "models/gaussians/gaussian_loss.h"

#include <stdexcept>
#include <vector>

#include "kernels/separable_blur.h"

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

// The normalized 1-D window [kSsimWindow] in t's dtype, on its device.
torch::Tensor ssim_window(const torch::Tensor& t) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64).device(t.device());
  const torch::Tensor x = torch::arange(kSsimWindow, opts) - (kSsimWindow / 2);
  const torch::Tensor g = torch::exp(-(x * x) / (2.0 * kSsimSigma * kSsimSigma));
  return (g / g.sum()).to(t.scalar_type());
}

// The window applied to each channel of t [1, K, H, W]: depthwise and separable, zero padding
// keeps H and W. The window is symmetric, so this is its own adjoint (backward filters the same).
// Differentiable (torch ops); blur_values below computes the same values faster on the CPU.
torch::Tensor blur(const torch::Tensor& t, const torch::Tensor& g) {
  const int64_t k = t.size(1), pad = kSsimWindow / 2;
  const torch::Tensor gv = g.view({1, 1, kSsimWindow, 1}).expand({k, 1, kSsimWindow, 1});
  const torch::Tensor gh = g.view({1, 1, 1, kSsimWindow}).expand({k, 1, 1, kSsimWindow});
  const torch::Tensor v =
      torch::conv2d(t, gv.contiguous(), torch::Tensor(), torch::IntArrayRef{1, 1},
                    torch::IntArrayRef{pad, 0}, torch::IntArrayRef{1, 1}, k);
  return torch::conv2d(v, gh.contiguous(), torch::Tensor(), torch::IntArrayRef{1, 1},
                       torch::IntArrayRef{0, pad}, torch::IntArrayRef{1, 1}, k);
}

// blur without a graph: the CPU kernel where it applies (kernels/separable_blur.h).
torch::Tensor blur_values(const torch::Tensor& t, const torch::Tensor& g) {
  if (t.device().is_cpu() && (t.scalar_type() == torch::kFloat32 ||
                              t.scalar_type() == torch::kFloat64))
    return kernels::separable_blur_cpu(t.squeeze(0), g).unsqueeze(0);
  return blur(t, g);
}

// SSIM = (A1 A2) / (B1 B2) per pixel and channel of xa, xb [1, C, H, W], with mu = blur(x),
// E = blur(products): A1 = 2 mu_a mu_b + C1, A2 = 2 (E_ab - mu_a mu_b) + C2,
// B1 = mu_a^2 + mu_b^2 + C1, B2 = (E_aa - mu_a^2) + (E_bb - mu_b^2) + C2.
// The five blurred maps in one stacked pass; `differentiable` = through torch ops (ssim_map).
struct SsimTerms {
  torch::Tensor mu_a, mu_b, a1, a2, b1, b2, map;
};
SsimTerms ssim_terms(const torch::Tensor& xa, const torch::Tensor& xb, bool differentiable) {
  const int64_t c = xa.size(1);
  const torch::Tensor stacked = torch::cat({xa, xb, xa * xa, xb * xb, xa * xb}, 1);
  const torch::Tensor window = ssim_window(xa);
  const std::vector<torch::Tensor> m =
      (differentiable ? blur(stacked, window) : blur_values(stacked, window)).split(c, 1);
  SsimTerms t;
  t.mu_a = m[0];
  t.mu_b = m[1];
  const torch::Tensor mu_ab = t.mu_a * t.mu_b, mu_aa = t.mu_a * t.mu_a, mu_bb = t.mu_b * t.mu_b;
  t.a1 = 2.0 * mu_ab + kSsimC1;
  t.a2 = 2.0 * (m[4] - mu_ab) + kSsimC2;
  t.b1 = mu_aa + mu_bb + kSsimC1;
  t.b2 = (m[2] - mu_aa) + (m[3] - mu_bb) + kSsimC2;
  t.map = (t.a1 * t.a2) / (t.b1 * t.b2);
  return t;
}

torch::Tensor as_batch(const torch::Tensor& image) {  // [H, W, C] -> [1, C, H, W]
  return image.permute({2, 0, 1}).unsqueeze(0);
}

// mean(SSIM map) with its gradient in closed form: one stacked blur forward and one backward,
// instead of autograd through the map's graph (the loss was a tenth of a 3DGS step at 256x256).
// With g the upstream gradient over the N entries, per entry:
//   dA1 = g A2 / (B1 B2), dA2 = g A1 / (B1 B2), dB1 = -g S / B1, dB2 = -g S / B2
//   d mu_a = 2 mu_b (dA1 - dA2) + 2 mu_a (dB1 - dB2), dE_aa = dB2, dE_ab = 2 dA2 (b alike),
// then, the blur being its own adjoint, da = blur(d mu_a) + 2 a blur(dE_aa) + b blur(dE_ab).
// B1 >= C1 and B2 ~ C2 or more, so nothing divides by a term that can vanish.
class SsimMeanFunction : public torch::autograd::Function<SsimMeanFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a,
                               const torch::Tensor& b) {
    const torch::Tensor xa = as_batch(a), xb = as_batch(b);
    const SsimTerms t = ssim_terms(xa, xb, /*differentiable=*/false);
    ctx->save_for_backward({xa, xb, t.mu_a, t.mu_b, t.a1, t.a2, t.b1, t.b2, t.map});
    return t.map.mean();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &xa = saved[0], &xb = saved[1], &mu_a = saved[2], &mu_b = saved[3],
                        &a1 = saved[4], &a2 = saved[5], &b1 = saved[6], &b2 = saved[7],
                        &map = saved[8];
    const bool want_a = ctx->needs_input_grad(0), want_b = ctx->needs_input_grad(1);
    if (!want_a && !want_b) return {torch::Tensor(), torch::Tensor()};
    const torch::Tensor g = grads[0].to(map.scalar_type()) / static_cast<double>(map.numel());
    const torch::Tensor inv = g / (b1 * b2);
    const torch::Tensor d_a = inv * (a2 - a1);       // dA1 - dA2
    const torch::Tensor gs = g * map;
    const torch::Tensor d_b = gs * (1.0 / b2 - 1.0 / b1);  // dB1 - dB2
    const torch::Tensor de_sq = -gs / b2;            // dE_aa = dE_bb
    const torch::Tensor de_ab = 2.0 * inv * a1;      // dE_ab
    std::vector<torch::Tensor> maps{de_sq, de_ab};
    if (want_a) maps.push_back(2.0 * (mu_b * d_a + mu_a * d_b));
    if (want_b) maps.push_back(2.0 * (mu_a * d_a + mu_b * d_b));
    const int64_t c = xa.size(1);
    const std::vector<torch::Tensor> f =
        blur_values(torch::cat(maps, 1), ssim_window(xa)).split(c, 1);
    auto image_grad = [](const torch::Tensor& x) {
      return x.squeeze(0).permute({1, 2, 0}).contiguous();
    };
    torch::Tensor ga, gb;
    if (want_a) ga = image_grad(f[2] + 2.0 * xa * f[0] + xb * f[1]);
    if (want_b) gb = image_grad(f[want_a ? 3 : 2] + 2.0 * xb * f[0] + xa * f[1]);
    return {ga, gb};
  }
};

}  // namespace

torch::Tensor ssim_map(const torch::Tensor& a, const torch::Tensor& b) {
  check_pair("ssim_map", a, b);
  return ssim_terms(as_batch(a), as_batch(b), /*differentiable=*/true)
      .map.squeeze(0)
      .permute({1, 2, 0});  // [H, W, C]
}

torch::Tensor ssim_same(const torch::Tensor& a, const torch::Tensor& b) {
  check_pair("ssim_same", a, b);
  return SsimMeanFunction::apply(a, b);
}

torch::Tensor photometric_loss(const torch::Tensor& render, const torch::Tensor& target,
                               double ssim_weight) {
  check_pair("photometric_loss", render, target);
  const torch::Tensor l1 = (render - target).abs().mean();
  return (1.0 - ssim_weight) * l1 + ssim_weight * (1.0 - ssim_same(render, target));
}

}  // namespace tessera::models::gaussians
