// Sampling from a trained denoiser (docs/diffusion.md, "Sampling"): DDPM's ancestral sampler and
// DDIM (eta = 0), both on a subsequence of K of the T noise levels, and the generative metrics of
// PointFlow and LION over Chamfer distances: MMD, COV and 1-NNA.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/diffusion/noise_schedule.h"

namespace tessera::models::diffusion {

enum class Sampler { Ddpm, Ddim };
Sampler parse_sampler(const std::string& name);  // "ddpm" | "ddim"; UserError otherwise

// The predicted noise for x_t [B, N, C] at levels t [B] (int64).
using NoisePredictor = std::function<torch::Tensor(const torch::Tensor& x_t, const torch::Tensor& t)>;

// Denoises `noise` (x_T, [B, N, C] float32) in `steps` steps, the levels T-1 = tau_K > ... > tau_1
// = 0 spread evenly (DDIM's respacing; steps = T is the full chain). Each step predicts x_0 from
// the noise estimate, clipped to [-1, 1] (the data's range: points in the unit ball, colors
// scaled to [-1, 1]); DDPM then draws from the posterior q(x_prev | x_t, x_0) of the respaced
// chain, cloud b's noise from generators[b] (so that a cloud does not depend on the others of
// its batch), DDIM (eta = 0) moves deterministically.
torch::Tensor sample(const NoisePredictor& predict, const NoiseSchedule& schedule,
                     const torch::Tensor& noise, int64_t steps, Sampler sampler,
                     std::vector<torch::Generator> generators);

// The respaced levels tau_1 = 0 < ... < tau_K = T - 1 of a K-step chain; UserError unless
// 1 <= K <= T.
std::vector<int64_t> respaced_levels(int64_t steps, int64_t timesteps);

// Chamfer distances between every cloud of `a` [A, N, 3] and of `b` [B, M, 3]: [A, B] float64,
// mean over a's points of the squared distance to the nearest of b's plus the same from b to a.
torch::Tensor chamfer_matrix(const torch::Tensor& a, const torch::Tensor& b);

struct GenerativeScores {
  double mmd = 0;       // mean over reference clouds of the Chamfer distance to the nearest sample
  double coverage = 0;  // fraction of reference clouds that are some sample's nearest
  double nna = 0;       // 1-NNA: leave-one-out 1-nearest-neighbour accuracy on samples + refs
};
// PointFlow's definitions (Yang et al. 2019) on Chamfer distance: `samples` [S, N, 3] against
// `references` [R, M, 3]. 1-NNA is 0.5 when samples and references are indistinguishable and 1.0
// when every cloud's nearest neighbour has its own label.
GenerativeScores generative_scores(const torch::Tensor& samples, const torch::Tensor& references);

}  // namespace tessera::models::diffusion
