// The cosine noise schedule and q(x_t | x_0) (noise_schedule.h).
#include "models/diffusion/noise_schedule.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tessera::models::diffusion {

namespace {

constexpr double kOffset = 0.008;   // s: keeps beta_0 from vanishing
constexpr double kMaxBeta = 0.999;  // avoids the singularity at t = T
constexpr double kPi = 3.14159265358979323846;

double alpha_bar(double fraction) {
  const double c = std::cos((fraction + kOffset) / (1.0 + kOffset) * kPi / 2.0);
  return c * c;
}

}  // namespace

NoiseSchedule::NoiseSchedule(int64_t timesteps) : timesteps_(timesteps) {
  std::vector<double> betas(timesteps), cumprod(timesteps);
  double product = 1.0;
  for (int64_t i = 0; i < timesteps; ++i) {
    const double t0 = static_cast<double>(i) / timesteps, t1 = static_cast<double>(i + 1) / timesteps;
    betas[i] = std::min(1.0 - alpha_bar(t1) / alpha_bar(t0), kMaxBeta);
    product *= 1.0 - betas[i];
    cumprod[i] = product;
  }
  betas_ = torch::tensor(betas, torch::kFloat64);
  alphas_cumprod_ = torch::tensor(cumprod, torch::kFloat64);
}

torch::Tensor NoiseSchedule::add_noise(const torch::Tensor& x0, const torch::Tensor& t,
                                       const torch::Tensor& noise) const {
  const torch::Tensor a = alphas_cumprod_.index_select(0, t.cpu()).to(x0.device());
  const torch::Tensor signal = a.sqrt().to(torch::kFloat32).view({-1, 1, 1});
  const torch::Tensor sigma = (1.0 - a).sqrt().to(torch::kFloat32).view({-1, 1, 1});
  return signal * x0 + sigma * noise;
}

}  // namespace tessera::models::diffusion
