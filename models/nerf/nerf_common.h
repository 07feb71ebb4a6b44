// Shared pieces of the NeRF models: counter-based randomness (pure functions of seed, step,
// purpose and ids, docs/nerf.md, invariant 1) and plain dense layers initialized from a seed.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace tessera::models::nerf {

// What a random stream is for; mixed into every hash so that streams never collide.
enum class RandomPurpose : uint64_t {
  kInit = 0x696e6974,           // parameter initialization
  kOccupancy = 0x6f636375,      // occupancy-grid jitter
  kSampleJitter = 0x6a697474,   // stratified sample jitter of nerf-mlp
};

// chain_hash (framework/hashing.h) over the values from the NeRF models' domain constant.
uint64_t hash_values(std::initializer_list<uint64_t> values);
// The top 24 bits of h as a float in [0, 1) (exact in float32).
float uniform_from_hash(uint64_t h);
// A CPU generator seeded from hash_values(values): draws on it are a pure function of them.
at::Generator make_generator(std::initializer_list<uint64_t> values);

// y = x W^T + b, a leaf weight [out, in] and bias [out] (both require grad).
struct DenseLayer {
  torch::Tensor weight;  // [out, in]
  torch::Tensor bias;    // [out]
  torch::Tensor operator()(const torch::Tensor& x) const;  // [N, in] -> [N, out]
};

// PyTorch's nn.Linear default: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)), drawn on the CPU from
// `generator` (so identical on every rank and device) and then moved to `device`.
DenseLayer make_dense(int64_t in, int64_t out, at::Generator& generator, torch::Device device);

// Appends weight then bias of every layer, in order.
void append_parameters(const std::vector<DenseLayer>& layers, std::vector<torch::Tensor>& out);

}  // namespace tessera::models::nerf
