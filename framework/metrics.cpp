// MSE, PSNR and SSIM for eval images. SSIM uses a separable Gaussian window applied with 'valid'
// convolutions in float64 on the images' device, following Mip-NeRF's compute_ssim.
#include "framework/metrics.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "distributed/errors.h"

namespace tessera {
namespace {

constexpr int64_t kSsimWindow = 11;    // window side, Wang et al. 2004
constexpr double kSsimSigma = 1.5;     // Gaussian window standard deviation, in pixels
constexpr double kSsimK1 = 0.01;       // C1 = (K1 * L)^2 stabilizes the luminance term
constexpr double kSsimK2 = 0.03;       // C2 = (K2 * L)^2 stabilizes the contrast term
constexpr double kDataRange = 1.0;     // L: images are in [0, 1]

std::string shape(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// Checks a and b and returns both as float64 on a's device.
std::pair<torch::Tensor, torch::Tensor> prepare(const char* what, const torch::Tensor& a,
                                                const torch::Tensor& b) {
  if (!a.defined() || !b.defined())
    throw std::invalid_argument(std::string(what) + ": undefined image");
  if (!a.is_floating_point() || !b.is_floating_point())
    throw std::invalid_argument(std::string(what) + ": images must be floating point in [0, 1]");
  if (a.sizes() != b.sizes())
    throw std::invalid_argument(std::string(what) + ": image shapes differ, " + shape(a) +
                                " vs " + shape(b));
  if (a.dim() != 3)
    throw std::invalid_argument(std::string(what) + ": expected images [H, W, C], got " +
                                shape(a));
  if (a.numel() == 0) throw std::invalid_argument(std::string(what) + ": empty image " + shape(a));
  return {a.detach().to(torch::kFloat64),
          b.detach().to(a.device(), torch::kFloat64)};
}

// Normalized 1-D Gaussian window [kSsimWindow], float64.
torch::Tensor gaussian_window(const torch::Device& device) {
  const double half = (kSsimWindow - 1) / 2.0;
  torch::Tensor x = torch::arange(kSsimWindow, torch::dtype(torch::kFloat64)) - half;
  torch::Tensor g = torch::exp(-0.5 * (x / kSsimSigma).pow(2));
  return (g / g.sum()).to(device);
}

}  // namespace

double ordered_sum(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const double* p = c.data_ptr<double>();
  double sum = 0.0;
  for (int64_t i = 0, n = c.numel(); i < n; ++i) sum += p[i];
  return sum;
}

double mse(const torch::Tensor& a, const torch::Tensor& b) {
  torch::NoGradGuard no_grad;
  auto [x, y] = prepare("mse", a, b);
  return ordered_sum((x - y).pow(2)) / static_cast<double>(x.numel());
}

double psnr(const torch::Tensor& a, const torch::Tensor& b) {
  const double m = mse(a, b);
  if (m == 0.0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(kDataRange * kDataRange / m);
}

double ssim(const torch::Tensor& a, const torch::Tensor& b) {
  torch::NoGradGuard no_grad;
  auto [x, y] = prepare("ssim", a, b);
  const int64_t h = x.size(0), w = x.size(1);
  if (h < kSsimWindow || w < kSsimWindow)
    throw UserError("ssim: images of " + std::to_string(h) + "x" + std::to_string(w) +
                    " pixels are smaller than the " + std::to_string(kSsimWindow) + "x" +
                    std::to_string(kSsimWindow) + " window; evaluate at a resolution of at least " +
                    std::to_string(kSsimWindow) + "x" + std::to_string(kSsimWindow));
  // [H, W, C] -> [C, 1, H, W]: each channel is filtered on its own.
  x = x.permute({2, 0, 1}).unsqueeze(1).contiguous();
  y = y.permute({2, 0, 1}).unsqueeze(1).contiguous();
  const torch::Tensor g = gaussian_window(x.device());
  const torch::Tensor gv = g.view({1, 1, kSsimWindow, 1});
  const torch::Tensor gh = g.view({1, 1, 1, kSsimWindow});
  // Separable 'valid' Gaussian filter: [C, 1, H, W] -> [C, 1, H - 10, W - 10].
  auto filt = [&](const torch::Tensor& t) {
    return torch::conv2d(torch::conv2d(t, gv), gh);
  };
  const torch::Tensor mu_x = filt(x), mu_y = filt(y);
  const torch::Tensor mu_xx = mu_x * mu_x, mu_yy = mu_y * mu_y, mu_xy = mu_x * mu_y;
  // Clipped as Mip-NeRF does: a no-op in exact arithmetic, it guards rounding.
  const torch::Tensor var_x = (filt(x * x) - mu_xx).clamp_min(0.0);
  const torch::Tensor var_y = (filt(y * y) - mu_yy).clamp_min(0.0);
  torch::Tensor cov = filt(x * y) - mu_xy;
  cov = torch::sign(cov) * torch::minimum(torch::sqrt(var_x * var_y), cov.abs());
  const double c1 = (kSsimK1 * kDataRange) * (kSsimK1 * kDataRange);
  const double c2 = (kSsimK2 * kDataRange) * (kSsimK2 * kDataRange);
  const torch::Tensor map = ((2.0 * mu_xy + c1) * (2.0 * cov + c2)) /
                            ((mu_xx + mu_yy + c1) * (var_x + var_y + c2));
  // Mean per channel, then over channels (all channels have the same number of windows).
  double sum = 0.0;
  for (int64_t c = 0; c < map.size(0); ++c)
    sum += ordered_sum(map[c]) / static_cast<double>(map[c].numel());
  return sum / static_cast<double>(map.size(0));
}

}  // namespace tessera
