// Counter-based randomness and dense layers for the NeRF models (see nerf_common.h).
#include "models/nerf/nerf_common.h"

#include <ATen/CPUGeneratorImpl.h>

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

void append_parameters(const std::vector<DenseLayer>& layers, std::vector<torch::Tensor>& out) {
  for (const auto& layer : layers) {
    out.push_back(layer.weight);
    out.push_back(layer.bias);
  }
}

}  // namespace tessera::models::nerf
