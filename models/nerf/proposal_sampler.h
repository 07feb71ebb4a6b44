// nerf-hash's proposal sampler (nerf.sampler = "proposal"): nerfacto's way of placing a ray's
// samples (mip-NeRF 360's proposal networks, Barron et al. 2022, as nerfstudio's nerfacto builds
// them), instead of marching the occupancy grid. Two small hash-grid density fields are
// evaluated in turn along each ray: the first on `first_samples` samples spread evenly in the
// distance s below, the second on `second_samples` drawn from the first's weights, and the
// radiance field on `nerf_samples` drawn from the second's. The proposal fields learn only from
// the interlevel loss, which asks each of them to bound the radiance field's weights from above
// (their samples then cover where the radiance field puts its weight); the sampling itself passes
// no gradient. docs/nerf.md, "Proposal sampling".
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/hash_encoding.h"
#include "kernels/ray_march.h"
#include "models/nerf/nerf_common.h"

namespace tessera::models::nerf {

struct ProposalOptions {
  int64_t first_samples = 256;   // nerfacto's num_proposal_samples_per_ray (256, 96)
  int64_t second_samples = 96;
  int64_t nerf_samples = 48;     // nerfacto's num_nerf_samples_per_ray
  float interlevel_weight = 1.0f;  // nerfacto's interlevel_loss_mult
  int log2_hashmap_size = 17;      // rows a level of each proposal field's table (nerfacto: 2^17)
  float max_log_density = 15.0f;   // sigma = exp(min(x, this)), as the radiance field's
};

// One ray batch's samples. Distances s are nerfacto's normalized ones: with g =
// lin_disp_distance (nerf_common.h; t in marching units: the frame of an unbounded scene, world
// units of a bounded one), s = (g(t) - g(near)) / (g(far) - g(near)) in [0, 1].
struct ProposalSamples {
  kernels::RayMarchOutput samples;  // the radiance field's: nerf_samples a ray, packed, in t
  torch::Tensor nerf_edges;         // [R, nerf_samples + 1] their interval edges in s
  // Per proposal field: its samples' edges in s [R, n + 1] and weights [R, n] (differentiable in
  // the field's parameters where gradients are on).
  std::vector<torch::Tensor> edges, weights;
};

class ProposalSampler {
 public:
  // The two fields as nerfacto's: 5 levels of F = 2 from N_min 16 to N_max 128 and 256,
  // options.log2_hashmap_size rows a level, then 10 -> 16 (ReLU) -> 1, density = exp of it
  // (clamped at options.max_log_density).
  ProposalSampler(const ProposalOptions& options, at::Generator& generator, torch::Device device);

  std::vector<torch::Tensor> parameters() const;

  // Samples along rays in marching space: origins, unit directions [R, 3], each ray's span
  // [t_near, t_far] [R] (t_far >= t_near; an empty span's samples have no length and no
  // weight). `to_unit` maps marching-space points [M, 3] to the hash grids' [0, 1]^3.
  // `uniforms` [R, 3] jitters the three draws (training: nerfacto's single jitter per ray and
  // draw); undefined, the samples are the draws' centres (eval). `step` anneals the proposal
  // weights (nerfacto's: w^a, a from 0 to 1 over the first kAnnealSteps steps).
  ProposalSamples sample(const torch::Tensor& origins, const torch::Tensor& directions,
                         const torch::Tensor& t_near, const torch::Tensor& t_far,
                         const std::function<torch::Tensor(const torch::Tensor&)>& to_unit,
                         const torch::Tensor& uniforms, int64_t step) const;

  // mip-NeRF 360's interlevel loss per ray [R]: over each proposal field, the mean over the
  // radiance field's samples of max(0, w - w_outer)^2 / (w + 1e-7), w_outer the proposal weight
  // on the intervals that overlap the sample's. `nerf_weights` [R * nerf_samples] (detached here).
  torch::Tensor interlevel_loss(const ProposalSamples& samples, const torch::Tensor& nerf_weights) const;

  // The annealing exponent at `step` (nerfacto: slope 10 over 1000 steps).
  static double anneal(int64_t step);
  static constexpr int64_t kAnnealSteps = 1000;

 private:
  struct Field {
    kernels::HashEncodingConfig encoding;
    torch::Tensor table;  // [L, T, F]
    DenseLayer hidden, out;
  };
  // sigma at points of [0, 1]^3 [M, 3] -> [M].
  torch::Tensor density(const Field& field, const torch::Tensor& unit) const;

  ProposalOptions options_;
  std::vector<Field> fields_;
};

}  // namespace tessera::models::nerf
