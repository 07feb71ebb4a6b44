// The point-diffusion denoiser (Point-E style): a transformer over point tokens. Each token is one
// point's xyz and rgb (6 channels); a timestep token is prepended; pre-norm blocks of multi-head
// self-attention (at::scaled_dot_product_attention) and a 4x GELU MLP; the output is the noise
// epsilon predicted for every point. No positional encoding: the points are a set.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tessera::models::diffusion {

// What forward() recomputes in backward instead of keeping (docs/diffusion.md, "Memory"):
// nothing; each transformer block; or only the attention core (softmax(QK^T)V), as Point-E,
// Shap-E and Megatron's selective recomputation do.
enum class Recompute { None, Blocks, Attention };
Recompute parse_recompute(const std::string& policy);  // "none" | "blocks" | "attention"

struct DenoiserOptions {
  int64_t width = 128;
  int64_t depth = 4;
  int64_t heads = 4;
  int64_t channels = 6;  // xyz, rgb
  double dropout = 0.0;
};

class PointDenoiser {
 public:
  // Parameters drawn from a generator seeded with `seed`: identical on every rank.
  PointDenoiser(const DenoiserOptions& options, uint64_t seed, torch::Device device);

  // x [B, N, channels] noisy points, t [B] int64 noise levels in [0, T): the predicted noise
  // [B, N, channels]. `training` turns dropout on.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t, bool training,
                        Recompute recompute = Recompute::None) const;

  // Every parameter with a stable name ("block3.qkv_w"), in an order every rank shares.
  const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters() const {
    return params_;
  }
  std::vector<torch::Tensor> parameters() const;
  int64_t parameter_count() const;
  const DenoiserOptions& options() const { return options_; }

 private:
  torch::Tensor param(const std::string& name) const;
  torch::Tensor block(int64_t k, const torch::Tensor& h, bool training, Recompute recompute) const;

  DenoiserOptions options_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::map<std::string, torch::Tensor> by_name_;  // the same tensors, for forward's lookups
};

// Sinusoidal embedding of the noise levels t [B] into [B, width] float32 (as DDPM/GLIDE).
torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t width);

}  // namespace tessera::models::diffusion
