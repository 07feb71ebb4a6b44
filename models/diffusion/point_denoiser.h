// The point-diffusion denoiser (Point-E style): a transformer over point tokens. Each token is one
// point's xyz and rgb (6 channels); a timestep token is prepended; pre-norm blocks of multi-head
// self-attention (at::scaled_dot_product_attention) and a 4x GELU MLP; the output is the noise
// epsilon predicted for every point. No positional encoding: the points are a set.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "framework/checkpoint_policy.h"

namespace tessera::models::diffusion {

// The checkpoint.policy values point-diffusion implements (docs/diffusion.md, "Memory"): keep
// everything; recompute each transformer block (keeping the attention core's output where the
// kernel allows, below); keep of the attention sublayer only what the
// fused attention kernel's backward needs besides Q, K, V (its output and log-sum-exp) and
// recompute the norm and the QKV projection (on the CPU without dropout; elsewhere the sublayer
// up to its output projection is recomputed whole); or recompute as few whole blocks as fit
// checkpoint.budget_mib.
enum class RecomputePolicy { None, Blocks, Attention, Budget };
RecomputePolicy parse_recompute_policy(const std::string& policy);  // UserError for others
std::vector<std::string> recompute_policy_names();  // none, blocks, attention, budget

// What forward() recomputes in backward instead of keeping.
struct Recompute {
  std::vector<bool> blocks;  // per transformer block: keep only its input, recompute it whole
                             // (missing entries: keep)
  bool attention = false;    // recompute the attention sublayer's inputs (norm, QKV) of the
                             // blocks kept
  PhaseTimer* phases = nullptr;  // charged the recomputes as "recompute" (CheckpointOptions)
  bool block(int64_t k) const { return k < static_cast<int64_t>(blocks.size()) && blocks[k]; }
};

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
                        const Recompute& recompute = {}) const;
  // Block k checkpointed for the blocks and budget policies: its input (and, where
  // keeps_attention_output, the attention core's output) kept, the rest recomputed in backward.
  torch::Tensor recomputed_block(int64_t k, const torch::Tensor& h, bool training,
                                 const CheckpointOptions& checkpointing = {}) const;
  // One transformer block on the hidden state h [B, 1 + N, width] (the forward's k-th), with
  // the attention sublayer up to its output projection recomputed when `attention_recompute`.
  torch::Tensor block(int64_t k, const torch::Tensor& h, bool training,
                      bool attention_recompute, const CheckpointOptions& checkpointing = {}) const;

  // Every parameter with a stable name ("block3.qkv_w"), in an order every rank shares.
  const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters() const {
    return params_;
  }
  std::vector<torch::Tensor> parameters() const;
  int64_t parameter_count() const;
  const DenoiserOptions& options() const { return options_; }

 private:
  torch::Tensor param(const std::string& name) const;
  // Whether the attention core's output can be kept while its inputs are recomputed
  // (KeepAttentionOutput: the fused CPU kernel, no dropout), and that output [B, 1 + N, width]
  // of block k for the block input h.
  bool keeps_attention_output(const torch::Tensor& h, bool training) const;
  torch::Tensor kept_attention_output(int64_t k, const torch::Tensor& h) const;
  // Block k after its attention core, whose output `attended` is [B, 1 + N, width]: the output
  // projection and the residual, then the MLP sublayer.
  torch::Tensor residual_tail(int64_t k, const torch::Tensor& h, const torch::Tensor& attended,
                              bool training) const;

  DenoiserOptions options_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::map<std::string, torch::Tensor> by_name_;  // the same tensors, for forward's lookups
};

// What a block of `model` stores until backward on `shapes` clouds of `tokens` points when kept
// whole (activation_bytes) and when recomputed (boundary_bytes: its output, and the attention
// output it keeps, see PointDenoiser::recomputed_block), measured on a dry
// forward of block 0 under autocast `precision` (every block has the same shapes). The default
// generators are left as they were (the dry forward draws dropout masks).
SegmentInfo measure_block(const PointDenoiser& model, int64_t shapes, int64_t tokens,
                          const std::string& precision, torch::Device device);

// The budget policy over the model's `depth` blocks of the measured size `block`: recompute as
// few whole blocks as keep the stored activations within `budget_mib` (framework/
// checkpoint_policy.h; UserError unless budget_mib > 0).
CheckpointPlan plan_block_budget(const SegmentInfo& block, int64_t depth, double budget_mib);

// Bytes stored until backward by `model`'s forward of `shapes` clouds of `tokens` points under
// `recompute` and autocast `precision`, measured on a dry forward (generators left as they were).
int64_t measure_forward(const PointDenoiser& model, int64_t shapes, int64_t tokens,
                        int64_t timesteps, const Recompute& recompute,
                        const std::string& precision, torch::Device device);

// Sinusoidal embedding of the noise levels t [B] into [B, width] float32 (as DDPM/GLIDE).
torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t width);

}  // namespace tessera::models::diffusion
