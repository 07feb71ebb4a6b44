// DDPM's forward process with the cosine schedule of Nichol & Dhariwal ("Improved DDPM"):
// alpha_bar(t) = cos^2(((t / T) + s) / (1 + s) * pi / 2), s = 0.008, each step's beta clipped at
// 0.999; x_t = sqrt(alpha_bar_t) x_0 + sqrt(1 - alpha_bar_t) epsilon.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace tessera::models::diffusion {

class NoiseSchedule {
 public:
  explicit NoiseSchedule(int64_t timesteps);
  int64_t timesteps() const { return timesteps_; }
  // alpha_bar_t for t = 0 .. T-1 (float64, CPU): from just below 1 down to near 0.
  const torch::Tensor& alphas_cumprod() const { return alphas_cumprod_; }
  const torch::Tensor& betas() const { return betas_; }
  // x_t for x0 [B, N, C], t [B] int64, noise like x0 (float32, on x0's device).
  torch::Tensor add_noise(const torch::Tensor& x0, const torch::Tensor& t,
                          const torch::Tensor& noise) const;

 private:
  int64_t timesteps_;
  torch::Tensor betas_;
  torch::Tensor alphas_cumprod_;
};

}  // namespace tessera::models::diffusion
