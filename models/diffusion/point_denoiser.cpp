// The point-diffusion transformer: parameters as plain tensors with stable names, forward with
// optional recomputation of blocks or of the attention core (framework/checkpoint.h).
#include "models/diffusion/point_denoiser.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>

#include <cmath>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/autocast.h"
#include "framework/checkpoint.h"
#include "framework/rng_state.h"

namespace tessera::models::diffusion {

namespace {

// The MLP of a block is 4x wider than the block (the transformer's usual ratio).
constexpr int64_t kMlpRatio = 4;
// Timestep embedding: periods from 2 pi up to 2 pi * 10000 (DDPM's).
constexpr double kMaxPeriod = 10000.0;
// The seed of the dry forwards' inputs (their values do not change what is stored).
constexpr uint64_t kMeasureSeed = 0x4d454153ull;  // "MEAS"

// Q, K, V [B, heads, N, d] of the block input h [B, N, w]: its layer norm and QKV projection.
std::vector<torch::Tensor> project_qkv(const torch::Tensor& h, const torch::Tensor& norm_w,
                                       const torch::Tensor& norm_b, const torch::Tensor& qkv_w,
                                       const torch::Tensor& qkv_b, int64_t heads) {
  const int64_t batch = h.size(0), tokens = h.size(1), w = h.size(2);
  const torch::Tensor a = torch::layer_norm(h, {w}, norm_w, norm_b);
  const torch::Tensor qkv = torch::linear(a, qkv_w, qkv_b)
                                .view({batch, tokens, 3, heads, w / heads})
                                .permute({2, 0, 3, 1, 4});  // [3, B, heads, tokens, w / heads]
  return {qkv[0], qkv[1], qkv[2]};
}

// The attention sublayer up to its output projection, keeping only what the fused CPU attention
// kernel's backward needs besides Q, K and V: the block input h, the core's output (also the
// projection's input) and one log-sum-exp per query. Backward recomputes the norm and the QKV
// projection (a few percent of the block's work) and runs the kernel's own backward, so the core
// itself is not run again. CPU only, without dropout (the flash kernel's conditions); the output
// is [B, N, heads, d], so that the projection reads it as [B, N, w] without a copy.
class KeepAttentionOutput : public torch::autograd::Function<KeepAttentionOutput> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& h, const torch::Tensor& norm_w,
                                                const torch::Tensor& norm_b,
                                                const torch::Tensor& qkv_w,
                                                const torch::Tensor& qkv_b, int64_t heads) {
    const AutocastState autocast = capture_autocast();
    const std::vector<torch::Tensor> q_k_v = project_qkv(h, norm_w, norm_b, qkv_w, qkv_b, heads);
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q_k_v[0], q_k_v[1], q_k_v[2]);
    const torch::Tensor tokens_major = out.transpose(1, 2).contiguous();  // [B, N, heads, d]
    ctx->save_for_backward({h, norm_w, norm_b, qkv_w, qkv_b, tokens_major, lse});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["cpu_autocast"] = autocast.cpu_enabled;
    ctx->saved_data["cpu_dtype"] = static_cast<int64_t>(autocast.cpu_dtype);
    return {tokens_major};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    AutocastState state = capture_autocast();
    state.cpu_enabled = ctx->saved_data["cpu_autocast"].toBool();
    state.cpu_dtype = static_cast<at::ScalarType>(ctx->saved_data["cpu_dtype"].toInt());
    torch::Tensor h = saved[0].detach().requires_grad_(true);
    std::vector<torch::Tensor> q_k_v;
    {
      AutocastReplay replay(state);  // the forward's Q, K, V dtypes
      torch::AutoGradMode grad_on(true);
      q_k_v = project_qkv(h, saved[1], saved[2], saved[3], saved[4],
                          ctx->saved_data["heads"].toInt());
    }
    const torch::Tensor out = saved[5].transpose(1, 2);  // [B, heads, N, d]
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grads[0].transpose(1, 2), q_k_v[0].detach(), q_k_v[1].detach(), q_k_v[2].detach(), out,
        saved[6], /*dropout_p=*/0.0, /*is_causal=*/false);
    std::vector<torch::Tensor> wrt = {h};
    for (int i = 1; i <= 4; ++i) wrt.push_back(saved[i]);
    const auto g = torch::autograd::grad(q_k_v, wrt, {dq, dk, dv}, /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    return {g[0], g[1], g[2], g[3], g[4], torch::Tensor()};
  }
};

}  // namespace

std::vector<std::string> recompute_policy_names() {
  return {"none", "blocks", "attention", "budget"};
}

RecomputePolicy parse_recompute_policy(const std::string& policy) {
  if (policy == "none") return RecomputePolicy::None;
  if (policy == "blocks") return RecomputePolicy::Blocks;
  if (policy == "attention") return RecomputePolicy::Attention;
  if (policy == "budget") return RecomputePolicy::Budget;
  throw UserError("checkpoint.policy = \"" + policy + "\" is not one of point-diffusion's: none, "
                  "blocks, attention, budget");
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
                                   bool attention_recompute,
                                   const CheckpointOptions& checkpointing) const {
  const std::string b = "block" + std::to_string(k) + ".";
  const int64_t w = options_.width, heads = options_.heads;
  const double p = training ? options_.dropout : 0.0;
  const int64_t batch = h.size(0), tokens = h.size(1);
  // The attention sublayer up to its output projection: norm, QKV projection and the core.
  // Recomputing only the core would save nothing when scaled_dot_product_attention picks a fused
  // kernel (flash or memory-efficient attention): the core then keeps its inputs Q, K, V (views
  // of the projection's output) and its output, which a checkpoint of the core keeps as well.
  // On the CPU without dropout the flash kernel's output and log-sum-exp are kept and only the
  // norm and the projection are recomputed (KeepAttentionOutput); elsewhere the sublayer is
  // checkpointed whole.
  if (attention_recompute && keeps_attention_output(h, training))
    return residual_tail(k, h, kept_attention_output(k, h), training);
  // By value: a checkpoint runs it again in backward, after this function has returned.
  auto attention = [this, b, heads, p](
                       const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
    const std::vector<torch::Tensor> q_k_v =
        project_qkv(in[0], param(b + "norm1_w"), param(b + "norm1_b"), param(b + "qkv_w"),
                    param(b + "qkv_b"), heads);
    return {at::scaled_dot_product_attention(q_k_v[0], q_k_v[1], q_k_v[2], {}, p)};
  };
  const torch::Tensor attended =
      attention_recompute ? checkpoint(attention, {h}, checkpointing)[0] : attention({h})[0];
  return residual_tail(k, h, attended.transpose(1, 2).reshape({batch, tokens, w}), training);
}

bool PointDenoiser::keeps_attention_output(const torch::Tensor& h, bool training) const {
  return h.device().is_cpu() && (!training || options_.dropout == 0.0);
}

torch::Tensor PointDenoiser::kept_attention_output(int64_t k, const torch::Tensor& h) const {
  const std::string b = "block" + std::to_string(k) + ".";
  return KeepAttentionOutput::apply(h, param(b + "norm1_w"), param(b + "norm1_b"),
                                    param(b + "qkv_w"), param(b + "qkv_b"), options_.heads)[0]
      .view({h.size(0), h.size(1), options_.width});
}

torch::Tensor PointDenoiser::residual_tail(int64_t k, const torch::Tensor& h,
                                           const torch::Tensor& attended, bool training) const {
  const std::string b = "block" + std::to_string(k) + ".";
  const int64_t w = options_.width;
  const double p = training ? options_.dropout : 0.0;
  torch::Tensor x = h + torch::dropout(torch::linear(attended, param(b + "proj_w"),
                                                     param(b + "proj_b")), p, training);
  const torch::Tensor n = torch::layer_norm(x, {w}, param(b + "norm2_w"), param(b + "norm2_b"));
  const torch::Tensor mlp = torch::linear(
      torch::gelu(torch::linear(n, param(b + "fc1_w"), param(b + "fc1_b"))), param(b + "fc2_w"),
      param(b + "fc2_b"));
  return x + torch::dropout(mlp, p, training);
}

torch::Tensor PointDenoiser::recomputed_block(int64_t k, const torch::Tensor& h, bool training,
                                             const CheckpointOptions& checkpointing) const {
  if (keeps_attention_output(h, training)) {
    // The block keeps its input and the attention core's output (one more width per token) and
    // recomputes the rest, so that the core, the most expensive part at many tokens, never runs
    // twice.
    return checkpoint(
        [this, k, training](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
          return {residual_tail(k, in[0], in[1], training)};
        },
        {h, kept_attention_output(k, h)}, checkpointing)[0];
  }
  return checkpoint(
      [this, k, training](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
        return {block(k, in[0], training, /*attention_recompute=*/false)};
      },
      {h}, checkpointing)[0];
}

torch::Tensor PointDenoiser::forward(const torch::Tensor& x, const torch::Tensor& t, bool training,
                                     const Recompute& recompute) const {
  const int64_t w = options_.width;
  const torch::Tensor emb = timestep_embedding(t, w);
  const torch::Tensor time_token = torch::linear(
      torch::silu(torch::linear(emb, param("time1_w"), param("time1_b"))), param("time2_w"),
      param("time2_b"));
  torch::Tensor h = torch::cat(
      {time_token.unsqueeze(1), torch::linear(x, param("input_w"), param("input_b"))}, 1);
  CheckpointOptions checkpointing;
  checkpointing.phases = recompute.phases;
  for (int64_t k = 0; k < options_.depth; ++k) {
    h = recompute.block(k) ? recomputed_block(k, h, training, checkpointing)
                           : block(k, h, training, recompute.attention, checkpointing);
  }
  const torch::Tensor out = torch::layer_norm(h.narrow(1, 1, h.size(1) - 1), {w},
                                              param("final_norm_w"), param("final_norm_b"));
  return torch::linear(out, param("output_w"), param("output_b"));
}

SegmentInfo measure_block(const PointDenoiser& model, int64_t shapes, int64_t tokens,
                          const std::string& precision, torch::Device device) {
  RngStateGuard keep({device});
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(kMeasureSeed);
  const torch::Tensor h =
      torch::randn({shapes, tokens + 1, model.options().width}, gen).to(device);
  AutocastScope autocast(precision, device);
  const SegmentMeasurement kept = measure_segment(
      [&model](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
        return {model.block(0, in[0], /*training=*/true, /*attention_recompute=*/false)};
      },
      {h}, device);
  // Recomputed, a block stores its output and, where the attention output is kept, that too.
  const SegmentMeasurement recomputed = measure_segment(
      [&model](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
        return {model.recomputed_block(0, in[0], /*training=*/true)};
      },
      {h}, device);
  // A recompute runs the block's forward again (or less of it, where the attention output is
  // kept): the kept block's forward time bounds its cost.
  return {"block", kept.activation_bytes, recomputed.activation_bytes, kept.forward_seconds};
}

CheckpointPlan plan_block_budget(const SegmentInfo& block, int64_t depth, double budget_mib) {
  std::vector<SegmentInfo> blocks(depth, block);
  for (int64_t k = 0; k < depth; ++k) blocks[k].name = "block" + std::to_string(k);
  CheckpointPolicyOptions options;
  options.budget_mib = budget_mib;
  return make_checkpoint_policy("budget", options)->plan(blocks);
}

int64_t measure_forward(const PointDenoiser& model, int64_t shapes, int64_t tokens,
                        int64_t timesteps, const Recompute& recompute,
                        const std::string& precision, torch::Device device) {
  RngStateGuard keep({device});
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(kMeasureSeed + 1);
  const torch::Tensor x = torch::randn({shapes, tokens, model.options().channels}, gen).to(device);
  const torch::Tensor t = torch::randint(timesteps, {shapes}, gen, torch::kInt64).to(device);
  AutocastScope autocast(precision, device);
  return measure_segment(
             [&](const std::vector<torch::Tensor>& in) -> std::vector<torch::Tensor> {
               return {model.forward(in[0], in[1], /*training=*/true, recompute)};
             },
             {x, t}, device)
      .activation_bytes;
}

}  // namespace tessera::models::diffusion
