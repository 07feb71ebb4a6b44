// Counter-based randomness and dense layers for the NeRF models (see nerf_common.h).
#include "models/nerf/nerf_common.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional.h>

#include <cmath>

#include "framework/hashing.h"

namespace tessera::models::nerf {

uint64_t hash_values(std::initializer_list<uint64_t> values) {
  return chain_hash(0x7465737365726100ull, values);  // "tessera"
}

float uniform_from_hash(uint64_t h) {
  constexpr float kInv2Pow24 = 1.0f / 16777216.0f;
  return static_cast<float>(h >> 40) * kInv2Pow24;
}

torch::Tensor ray_uniforms(const torch::Tensor& ray_ids, uint64_t seed, int64_t step,
                           RandomPurpose purpose, int64_t count) {
  const auto ids = ray_ids.to(torch::kCPU).to(torch::kInt64).contiguous();
  const int64_t r = ids.size(0);
  auto out = torch::empty({r, count}, torch::kFloat32);
  const int64_t* id = ids.data_ptr<int64_t>();
  float* u = out.data_ptr<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < count; ++j)
      u[i * count + j] = uniform_from_hash(
          hash_values({seed, static_cast<uint64_t>(step), static_cast<uint64_t>(purpose),
                       static_cast<uint64_t>(id[i]), static_cast<uint64_t>(j)}));
  return out;
}

at::Generator make_generator(std::initializer_list<uint64_t> values) {
  return at::make_generator<at::CPUGeneratorImpl>(hash_values(values));
}

torch::Tensor DenseLayer::operator()(const torch::Tensor& x) const {
  return torch::nn::functional::linear(x, weight, bias);
}

DenseLayer make_dense(int64_t in, int64_t out, at::Generator& generator, torch::Device device) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  auto draw = [&](at::IntArrayRef shape) {
    auto u = torch::rand(shape, generator, torch::TensorOptions().dtype(torch::kFloat32));
    return (u * (2.0 * bound) - bound).to(device).set_requires_grad(true);
  };
  DenseLayer layer;
  layer.weight = draw({out, in});
  layer.bias = draw({out});
  return layer;
}

torch::Tensor lin_disp_distance(const torch::Tensor& t) {
  return torch::where(t < 1.0f, t * 0.5f, 1.0f - 0.5f / t.clamp_min(1.0f));
}

torch::Tensor distortion_loss(const torch::Tensor& weights, const torch::Tensor& s_begin,
                              const torch::Tensor& s_end, const torch::Tensor& ray_offsets,
                              const torch::Tensor& ray_indices) {
  const int64_t rays = ray_offsets.size(0) - 1;
  const auto w = weights.to(torch::kFloat64);
  const auto a = s_begin.to(torch::kFloat64), b = s_end.to(torch::kFloat64);
  const auto m = 0.5 * (a + b);
  const auto total = torch::zeros({rays}, w.options());
  if (w.size(0) == 0) return total.to(weights.dtype());
  // Exclusive prefix sums within each ray: a global cumsum minus its value at the ray's start.
  auto exclusive = [&](const torch::Tensor& x) {
    const auto inclusive = x.cumsum(0);
    const auto before = inclusive - x;
    const auto start = ray_offsets.narrow(0, 0, rays).clamp_max(x.size(0) - 1);
    return before - before.index_select(0, start).index_select(0, ray_indices);
  };
  const auto w_before = exclusive(w), wm_before = exclusive(w * m);
  // sum_{i,j} w_i w_j |m_i - m_j| = 2 sum_i w_i (m_i W_{<i} - (w m)_{<i}), midpoints in order.
  const auto pair = 2.0 * w * (m * w_before - wm_before);
  const auto self = w * w * (b - a) / 3.0;
  return total.index_add(0, ray_indices, pair + self).to(weights.dtype());
}

void append_parameters(const std::vector<DenseLayer>& layers, std::vector<torch::Tensor>& out) {
  for (const auto& layer : layers) {
    out.push_back(layer.weight);
    out.push_back(layer.bias);
  }
}

}  // namespace tessera::models::nerf
