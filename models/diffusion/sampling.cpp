// DDPM and DDIM sampling on a respaced chain, and MMD / COV / 1-NNA over Chamfer distances.
#include "models/diffusion/sampling.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "distributed/errors.h"

namespace tessera::models::diffusion {

Sampler parse_sampler(const std::string& name) {
  if (name == "ddpm") return Sampler::Ddpm;
  if (name == "ddim") return Sampler::Ddim;
  throw UserError("unknown sampler '" + name + "' (ddpm or ddim)");
}

std::vector<int64_t> respaced_levels(int64_t steps, int64_t total) {
  if (steps < 1 || steps > total)
    throw UserError("sampling steps = " + std::to_string(steps) + " must lie in [1, " +
                    std::to_string(total) + "] (the model's diffusion.timesteps)");
  // tau_1 = 0 < ... < tau_K = T - 1, evenly spread.
  std::vector<int64_t> levels(steps);
  for (int64_t i = 0; i < steps; ++i)
    levels[i] = steps == 1 ? total - 1 : (i * (total - 1) + (steps - 1) / 2) / (steps - 1);
  return levels;
}

torch::Tensor sample(const NoisePredictor& predict, const NoiseSchedule& schedule,
                     const torch::Tensor& noise, int64_t steps, Sampler sampler,
                     std::vector<torch::Generator> generators) {
  const std::vector<int64_t> levels = respaced_levels(steps, schedule.timesteps());
  if (sampler == Sampler::Ddpm && static_cast<int64_t>(generators.size()) != noise.size(0))
    throw std::invalid_argument("sample: DDPM needs one generator per cloud");
  const auto a = schedule.alphas_cumprod().accessor<double, 1>();
  torch::NoGradGuard no_grad;
  torch::Tensor x = noise;
  const int64_t batch = noise.size(0);
  for (int64_t i = steps - 1; i >= 0; --i) {
    const int64_t t = levels[i];
    const double a_t = a[t], a_prev = i > 0 ? a[levels[i - 1]] : 1.0;
    const torch::Tensor level =
        torch::full({batch}, t, torch::TensorOptions().dtype(torch::kInt64).device(x.device()));
    const torch::Tensor eps = predict(x, level).to(torch::kFloat32);
    const torch::Tensor x0 =
        ((x - std::sqrt(1.0 - a_t) * eps) / std::sqrt(a_t)).clamp(-1.0, 1.0);
    if (sampler == Sampler::Ddim) {
      // eta = 0: the noise direction of the estimate, rescaled to the previous level.
      const torch::Tensor direction = (x - std::sqrt(a_t) * x0) / std::sqrt(1.0 - a_t);
      x = std::sqrt(a_prev) * x0 + std::sqrt(1.0 - a_prev) * direction;
      continue;
    }
    // The respaced chain's step: beta = 1 - a_t / a_prev; posterior mean and variance.
    const double beta = 1.0 - a_t / a_prev;
    const double mean_x0 = beta * std::sqrt(a_prev) / (1.0 - a_t);
    const double mean_xt = (1.0 - a_prev) * std::sqrt(1.0 - beta) / (1.0 - a_t);
    x = mean_x0 * x0 + mean_xt * x;
    if (i > 0) {
      const double variance = beta * (1.0 - a_prev) / (1.0 - a_t);
      std::vector<torch::Tensor> z;
      for (int64_t b = 0; b < batch; ++b)
        z.push_back(torch::randn({x.size(1), x.size(2)}, generators[b], torch::kFloat32));
      x = x + std::sqrt(variance) * torch::stack(z).to(x.device());
    }
  }
  return x;
}

torch::Tensor chamfer_matrix(const torch::Tensor& a, const torch::Tensor& b) {
  // Distances in chunks of b's clouds, so that one chunk's [chunk, N, M] squared distances stay
  // near kChunkElements (64 MiB of float64) whatever the cloud sizes.
  constexpr int64_t kChunkElements = int64_t{8} << 20;
  const torch::Tensor pa = a.to(torch::kFloat64), pb = b.to(torch::kFloat64);
  const int64_t chunk = std::max<int64_t>(1, kChunkElements / (pa.size(1) * pb.size(1)));
  torch::Tensor out = torch::empty({pa.size(0), pb.size(0)}, torch::kFloat64);
  for (int64_t i = 0; i < pa.size(0); ++i) {
    for (int64_t j = 0; j < pb.size(0); j += chunk) {
      const int64_t n = std::min(chunk, pb.size(0) - j);
      const torch::Tensor part = pb.narrow(0, j, n);
      const torch::Tensor d = torch::cdist(pa[i].unsqueeze(0).expand({n, -1, -1}), part).pow(2);
      out[i].narrow(0, j, n).copy_(std::get<0>(d.min(2)).mean(1) + std::get<0>(d.min(1)).mean(1));
    }
  }
  return out;
}

GenerativeScores generative_scores(const torch::Tensor& samples, const torch::Tensor& references) {
  const int64_t s = samples.size(0), r = references.size(0);
  const torch::Tensor sr = chamfer_matrix(samples, references);  // [S, R]
  GenerativeScores scores;
  scores.mmd = std::get<0>(sr.min(0)).mean().item<double>();
  const torch::Tensor nearest = std::get<1>(sr.min(1));  // each sample's nearest reference
  std::vector<bool> covered(static_cast<size_t>(r), false);
  for (int64_t i = 0; i < s; ++i) covered[static_cast<size_t>(nearest[i].item<int64_t>())] = true;
  int64_t count = 0;
  for (const bool c : covered) count += c ? 1 : 0;
  scores.coverage = static_cast<double>(count) / static_cast<double>(r);
  // 1-NNA over the union: labels 0 (sample) and 1 (reference), self excluded.
  const torch::Tensor ss = chamfer_matrix(samples, samples), rr = chamfer_matrix(references, references);
  torch::Tensor all = torch::cat({torch::cat({ss, sr}, 1), torch::cat({sr.t(), rr}, 1)}, 0);
  all.fill_diagonal_(INFINITY);
  const torch::Tensor neighbour = std::get<1>(all.min(1));
  const torch::Tensor label = torch::cat({torch::zeros({s}, torch::kInt64), torch::ones({r}, torch::kInt64)});
  scores.nna = (label.index_select(0, neighbour) == label).to(torch::kFloat64).mean().item<double>();
  return scores;
}

}  // namespace tessera::models::diffusion
