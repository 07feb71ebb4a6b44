// The point-diffusion transformer: parameters as plain tensors with stable names, forward with
// optional recomputation of blocks or of the attention core (framework/checkpoint.h).
#include "models/diffusion/point_denoiser.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/checkpoint.h"

namespace tessera::models::diffusion {

namespace {

// The MLP of a block is 4x wider than the block (the transformer's usual ratio).
constexpr int64_t kMlpRatio = 4;
// Timestep embedding: periods from 2 pi up to 2 pi * 10000 (DDPM's).
constexpr double kMaxPeriod = 10000.0;

}  // namespace

Recompute parse_recompute(const std::string& policy) {
  if (policy == "none") return Recompute::None;
  if (policy == "blocks") return Recompute::Blocks;
  if (policy == "attention") return Recompute::Attention;
  throw UserError("checkpoint.policy = \"" + policy + "\" is not one of point-diffusion's: none, "
                  "blocks, attention");
}

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t width) {
  const int64_t half = width / 2;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(t.device());
  const torch::Tensor freqs =
      torch::exp(-std::log(kMaxPeriod) * torch::arange(half, f32) / static_cast<double>(half));
  const torch::Tensor args = t.to(torch::kFloat32).unsqueeze(1) * freqs.unsqueeze(0);
  torch::Tensor emb = torch::cat({torch::cos(args), torch::sin(args)}, 1);
  if (width % 2 == 1) emb = torch::cat({emb, torch::zeros({t.size(0), 1}, f32)}, 1);
  return emb;
}

PointDenoiser::PointDenoiser(const DenoiserOptions& options, uint64_t seed, torch::Device device)
    : options_(options) {
  if (options.width % options.heads != 0)
    throw std::invalid_argument("PointDenoiser: width must be a multiple of heads");
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t w = options.width, c = options.channels, m = kMlpRatio * options.width;
  // Linear weights ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (torch.nn.Linear's bound), biases 0,
  // norms 1 and 0; the output layer starts at zero (GLIDE's and Point-E's zero_module), so the
  // first prediction is no noise at all.
  auto linear = [&](const std::string& name, int64_t out, int64_t in, bool zero = false) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    torch::Tensor weight = zero ? torch::zeros({out, in})
                                : torch::rand({out, in}, gen, torch::kFloat32) * (2 * bound) - bound;
    params_.emplace_back(name + "_w", weight);
    params_.emplace_back(name + "_b", torch::zeros({out}));
  };
  auto norm = [&](const std::string& name) {
    params_.emplace_back(name + "_w", torch::ones({w}));
    params_.emplace_back(name + "_b", torch::zeros({w}));
  };
  linear("input", w, c);
  linear("time1", w, w);
  linear("time2", w, w);
  for (int64_t k = 0; k < options.depth; ++k) {
    const std::string b = "block" + std::to_string(k) + ".";
    norm(b + "norm1");
    linear(b + "qkv", 3 * w, w);
    linear(b + "proj", w, w);
    norm(b + "norm2");
    linear(b + "fc1", m, w);
    linear(b + "fc2", w, m);
  }
  norm("final_norm");
  linear("output", c, w, /*zero=*/true);
  for (auto& [name, p] : params_) {
    p = p.to(device).set_requires_grad(true);
    by_name_.emplace(name, p);
  }
}

torch::Tensor PointDenoiser::param(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) throw std::logic_error("PointDenoiser: no parameter " + name);
  return it->second;
}

std::vector<torch::Tensor> PointDenoiser::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& entry : params_) out.push_back(entry.second);
  return out;
}

int64_t PointDenoiser::parameter_count() const {
  int64_t n = 0;
  for (const auto& entry : params_) n += entry.second.numel();
  return n;
}

torch::Tensor PointDenoiser::block(int64_t k, const torch::Tensor& h, bool training,
                                   Recompute recompute) const {
  const std::string b = "block" + std::to_string(k) + ".";
  const int64_t w = options_.width, heads = options_.heads;
  const double p = training ? options_.dropout : 0.0;
  const int64_t batch = h.size(0), tokens = h.size(1);
  const torch::Tensor a = torch::layer_norm(h, {w}, param(b + "norm1_w"), param(b + "norm1_b"));
  const torch::Tensor qkv = torch::linear(a, param(b + "qkv_w"), param(b + "qkv_b"))
                                .view({batch, tokens, 3, heads, w / heads})
                                .permute({2, 0, 3, 1, 4});  // [3, B, heads, tokens, w / heads]
  auto attend = [p](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
    return {at::scaled_dot_product_attention(in[0], in[1], in[2], {}, p)};
  };
  const std::vector<torch::Tensor> q_k_v = {qkv[0], qkv[1], qkv[2]};
  torch::Tensor attended = recompute == Recompute::Attention ? checkpoint(attend, q_k_v)[0]
                                                             : attend(q_k_v)[0];
  attended = attended.transpose(1, 2).reshape({batch, tokens, w});
  torch::Tensor x = h + torch::dropout(torch::linear(attended, param(b + "proj_w"),
                                                     param(b + "proj_b")), p, training);
  const torch::Tensor n = torch::layer_norm(x, {w}, param(b + "norm2_w"), param(b + "norm2_b"));
  const torch::Tensor mlp = torch::linear(
      torch::gelu(torch::linear(n, param(b + "fc1_w"), param(b + "fc1_b"))), param(b + "fc2_w"),
      param(b + "fc2_b"));
  return x + torch::dropout(mlp, p, training);
}

torch::Tensor PointDenoiser::forward(const torch::Tensor& x, const torch::Tensor& t, bool training,
                                     Recompute recompute) const {
  const int64_t w = options_.width;
  const torch::Tensor emb = timestep_embedding(t, w);
  const torch::Tensor time_token = torch::linear(
      torch::silu(torch::linear(emb, param("time1_w"), param("time1_b"))), param("time2_w"),
      param("time2_b"));
  torch::Tensor h = torch::cat(
      {time_token.unsqueeze(1), torch::linear(x, param("input_w"), param("input_b"))}, 1);
  for (int64_t k = 0; k < options_.depth; ++k) {
    if (recompute == Recompute::Blocks) {
      h = checkpoint(
          [this, k, training](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
            return {block(k, in[0], training, Recompute::None)};
          },
          {h})[0];
    } else {
      h = block(k, h, training, recompute);
    }
  }
  const torch::Tensor out = torch::layer_norm(h.narrow(1, 1, h.size(1) - 1), {w},
                                              param("final_norm_w"), param("final_norm_b"));
  return torch::linear(out, param("output_w"), param("output_b"));
}

}  // namespace tessera::models::diffusion
