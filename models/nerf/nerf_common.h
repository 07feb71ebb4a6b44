// Shared pieces of the NeRF models: counter-based randomness (pure functions of seed, step,
// purpose and ids, docs/nerf.md, invariant 1) and plain dense layers initialized from a seed.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace tessera::models::nerf {

// What a random stream is for; mixed into every hash so that streams never collide.
enum class RandomPurpose : uint64_t {
  kInit = 0x696e6974,           // parameter initialization
  kOccupancy = 0x6f636375,      // occupancy-grid jitter
  kSampleJitter = 0x6a697474,   // stratified sample jitter of nerf-mlp
  kMarchJitter = 0x6d617263,    // where nerf-hash's march starts along each training ray
  kProposalJitter = 0x70726f70, // nerf-hash's proposal sampler: its three draws per training ray
};

// chain_hash (framework/hashing.h) over the values from the NeRF models' domain constant.
uint64_t hash_values(std::initializer_list<uint64_t> values);
// The top 24 bits of h as a float in [0, 1) (exact in float32).
float uniform_from_hash(uint64_t h);
// [R, count] float32 on the CPU: uniform_from_hash(hash_values({seed, step, purpose, ray_ids[i],
// j})), per-ray randomness that is the same for a ray in any batch and on any rank.
torch::Tensor ray_uniforms(const torch::Tensor& ray_ids, uint64_t seed, int64_t step,
                           RandomPurpose purpose, int64_t count);
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

// mip-NeRF 360's and nerfacto's distance along a ray: g(t) = t / 2 for t < 1 and 1 - 1 / (2 t)
// beyond, t from the camera in marching units: linear near the camera, like disparity far off,
// in [0, 1). Elementwise.
torch::Tensor lin_disp_distance(const torch::Tensor& t);

// mip-NeRF 360's distortion loss (Barron et al. 2022, eq. 15), per ray, on packed samples: with
// ray r's samples i in order, weights w_i and intervals [a_i, b_i] in a normalized distance s
// (midpoint m_i, width d_i = b_i - a_i),
//   L_r = sum_{i,j} w_i w_j |m_i - m_j| + 1/3 sum_i w_i^2 d_i,
// computed in O(S) with per-ray prefix sums (in float64). Small when each ray's weight sits in
// one short interval, as on a surface; large for fog spread along the ray and for floaters apart
// from the surface. Differentiable in `weights`.
torch::Tensor distortion_loss(const torch::Tensor& weights,      // [S]
                              const torch::Tensor& s_begin,      // [S] a_i
                              const torch::Tensor& s_end,        // [S] b_i
                              const torch::Tensor& ray_offsets,  // [R + 1] int64
                              const torch::Tensor& ray_indices); // [S] int64; returns [R]

// Appends weight then bias of every layer, in order.
void append_parameters(const std::vector<DenseLayer>& layers, std::vector<torch::Tensor>& out);

}  // namespace tessera::models::nerf
