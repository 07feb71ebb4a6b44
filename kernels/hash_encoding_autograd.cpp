// hash_encoding's entry point: the level table from the config, input checks, the
// torch::autograd::Function that saves what backward needs, and the CPU / CUDA dispatch.
#include "kernels/hash_encoding.h"
#include "kernels/device_dispatch.h"

#include <torch/autograd.h>

#include <cmath>

namespace tessera::kernels {

namespace {

void check_config(const HashEncodingConfig& c) {
  TORCH_CHECK(c.levels >= 1 && c.levels <= kHashEncodingMaxLevels,
              "hash_encoding: levels must be in [1, ", kHashEncodingMaxLevels, "], got ", c.levels);
  TORCH_CHECK(c.features_per_level >= 1,
              "hash_encoding: features_per_level must be >= 1, got ", c.features_per_level);
  TORCH_CHECK(c.log2_hashmap_size >= 1 && c.log2_hashmap_size <= 30,
              "hash_encoding: log2_hashmap_size must be in [1, 30], got ", c.log2_hashmap_size);
  TORCH_CHECK(c.base_resolution >= 1,
              "hash_encoding: base_resolution must be >= 1, got ", c.base_resolution);
  TORCH_CHECK(std::isfinite(c.per_level_scale) && c.per_level_scale >= 1.0,
              "hash_encoding: per_level_scale must be finite and >= 1, got ", c.per_level_scale);
}

void check_inputs(const torch::Tensor& positions, const torch::Tensor& embeddings,
                  const HashEncodingConfig& c) {
  TORCH_CHECK(positions.dim() == 2 && positions.size(1) == 3,
              "hash_encoding: positions must be [N, 3], got ", positions.sizes());
  TORCH_CHECK(positions.scalar_type() == torch::kFloat32,
              "hash_encoding: positions must be float32, got ", positions.scalar_type());
  TORCH_CHECK(embeddings.scalar_type() == torch::kFloat32,
              "hash_encoding: embeddings must be float32 (float16 / bfloat16 tables are not "
              "supported), got ", embeddings.scalar_type());
  const int64_t table_size = int64_t{1} << c.log2_hashmap_size;
  TORCH_CHECK(embeddings.dim() == 3 && embeddings.size(0) == c.levels &&
                  embeddings.size(1) == table_size && embeddings.size(2) == c.features_per_level,
              "hash_encoding: embeddings must be [L, T, F] = [", c.levels, ", ", table_size, ", ",
              c.features_per_level, "] for this config, got ", embeddings.sizes());
  TORCH_CHECK(embeddings.device() == positions.device(), "hash_encoding: embeddings must be on ",
              positions.device(), " with positions, got ", embeddings.device());
}

HashEncodingConfig config_from(const torch::autograd::AutogradContext& ctx) {
  HashEncodingConfig c;
  c.levels = static_cast<int>(ctx.saved_data.at("levels").toInt());
  c.features_per_level = static_cast<int>(ctx.saved_data.at("features_per_level").toInt());
  c.log2_hashmap_size = static_cast<int>(ctx.saved_data.at("log2_hashmap_size").toInt());
  c.base_resolution = static_cast<int>(ctx.saved_data.at("base_resolution").toInt());
  c.per_level_scale = ctx.saved_data.at("per_level_scale").toDouble();
  return c;
}

}  // namespace

// The autograd wrapper behind hash_encoding. Saves positions only (the output is linear in
// embeddings, so backward needs neither them nor the output); the config travels in saved_data.
class HashEncodingFunction : public torch::autograd::Function<HashEncodingFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& positions,   // [N, 3]
                                                const torch::Tensor& embeddings,  // [L, T, F]
                                                const HashEncodingConfig& config);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

double hash_encoding_per_level_scale(int base_resolution, int finest_resolution, int levels) {
  TORCH_CHECK(base_resolution >= 1 && finest_resolution >= base_resolution && levels >= 1,
              "hash_encoding_per_level_scale: need 1 <= base_resolution (", base_resolution,
              ") <= finest_resolution (", finest_resolution, ") and levels (", levels, ") >= 1");
  if (levels == 1) return 1.0;
  return std::exp((std::log(static_cast<double>(finest_resolution)) -
                   std::log(static_cast<double>(base_resolution))) /
                  (levels - 1));
}

std::vector<HashGridLevel> hash_grid_levels(const HashEncodingConfig& config) {
  check_config(config);
  const int64_t table_size = int64_t{1} << config.log2_hashmap_size;
  std::vector<HashGridLevel> levels(config.levels);
  for (int l = 0; l < config.levels; ++l) {
    const double scaled = config.base_resolution * std::pow(config.per_level_scale, l);
    TORCH_CHECK(scaled <= static_cast<double>(kHashEncodingMaxResolution),
                "hash_encoding: level ", l, " would have ", scaled, " cells per axis, more than ",
                kHashEncodingMaxResolution, "; lower per_level_scale or levels");
    const int64_t n = static_cast<int64_t>(std::floor(scaled + kHashEncodingResolutionSlack));
    const int64_t vertices = n + 1;  // per axis, at most 2^24 + 1
    levels[l].resolution = n;
    // vertices^3 <= table_size, without forming vertices^3 (up to 2^72, past int64): for
    // positive integers v^2 * v <= T exactly when v^2 <= floor(T / v), and v^2 fits.
    levels[l].dense = vertices * vertices <= table_size / vertices;
  }
  return levels;
}

torch::autograd::variable_list HashEncodingFunction::forward(
    torch::autograd::AutogradContext* ctx, const torch::Tensor& positions,
    const torch::Tensor& embeddings, const HashEncodingConfig& config) {
  const std::vector<HashGridLevel> levels = hash_grid_levels(config);
  check_inputs(positions, embeddings, config);
  torch::Tensor encoded;
  encoded = on_device(
      "hash_encoding", positions,
      [&] { return cpu::hash_encoding_fwd(positions, embeddings, levels); },
      [&] { return cuda::hash_encoding_fwd(positions, embeddings, levels); });
  ctx->save_for_backward({positions});
  ctx->saved_data["levels"] = config.levels;
  ctx->saved_data["features_per_level"] = config.features_per_level;
  ctx->saved_data["log2_hashmap_size"] = config.log2_hashmap_size;
  ctx->saved_data["base_resolution"] = config.base_resolution;
  ctx->saved_data["per_level_scale"] = config.per_level_scale;
  return {encoded};
}

torch::autograd::variable_list HashEncodingFunction::backward(
    torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {
  const torch::Tensor positions = ctx->get_saved_variables()[0];
  const HashEncodingConfig config = config_from(*ctx);
  const std::vector<HashGridLevel> levels = hash_grid_levels(config);
  const int64_t table_size = int64_t{1} << config.log2_hashmap_size;
  const torch::Tensor& v_encoded = grad_outputs[0];
  torch::Tensor v_embeddings;
  v_embeddings = on_device(
      "hash_encoding", positions,
      [&] {
        return cpu::hash_encoding_bwd(positions, levels, table_size, config.features_per_level,
                                      v_encoded);
      },
      [&] {
        return cuda::hash_encoding_bwd(positions, levels, table_size, config.features_per_level,
                                       v_encoded);
      });
  // One gradient per forward input: positions (none), embeddings, config.
  return {torch::Tensor(), v_embeddings, torch::Tensor()};
}

torch::Tensor hash_encoding(const torch::Tensor& positions, const torch::Tensor& embeddings,
                            const HashEncodingConfig& config) {
  if (torch::GradMode::is_enabled())
    TORCH_CHECK(!positions.requires_grad(),
                "hash_encoding: positions get no gradient; pass them detached");
  return HashEncodingFunction::apply(positions, embeddings, config)[0];
}

}  // namespace tessera::kernels
