// nerf-hash: hash encoding -> density MLP -> colour MLP, marched through the occupancy grid.
#include "models/nerf/nerf_hash.h"

#include <cmath>
#include <stdexcept>

#include "framework/checkpoint.h"
#include "framework/checkpoint_policy.h"
#include "kernels/ray_march.h"
#include "kernels/volume_render.h"
#include "models/nerf/encodings.h"

namespace tessera::models::nerf {

NerfHash::NerfHash(const NerfHashOptions& options, const ModelContext& context, uint64_t seed)
    : options_(options), context_(context), grid_(options.grid, context.scene_bounds, context.device) {
  encoding_.levels = options_.levels;
  encoding_.features_per_level = options_.features_per_level;
  encoding_.log2_hashmap_size = options_.log2_hashmap_size;
  encoding_.base_resolution = options_.base_resolution;
  encoding_.per_level_scale = kernels::hash_encoding_per_level_scale(
      options_.base_resolution, options_.finest_resolution, options_.levels);
  kernels::hash_grid_levels(encoding_);  // validates

  auto gen = make_generator({seed, static_cast<uint64_t>(RandomPurpose::kInit)});
  const int64_t table = int64_t{1} << options_.log2_hashmap_size;
  embeddings_ = (torch::rand({options_.levels, table, options_.features_per_level}, gen,
                             torch::TensorOptions().dtype(torch::kFloat32)) *
                     (2.0 * options_.embedding_init) -
                 options_.embedding_init)
                    .to(context.device)
                    .set_requires_grad(true);
  const int64_t enc_width = int64_t{options_.levels} * options_.features_per_level;
  density_layers_.push_back(make_dense(enc_width, options_.hidden_width, gen, context.device));
  density_layers_.push_back(make_dense(options_.hidden_width, options_.geo_features, gen, context.device));
  int64_t in = options_.geo_features + kShDegree4Width;
  for (int i = 0; i < options_.color_hidden_layers; ++i) {
    color_layers_.push_back(make_dense(in, options_.hidden_width, gen, context.device));
    in = options_.hidden_width;
  }
  color_layers_.push_back(make_dense(in, 3, gen, context.device));

  const auto& b = context.scene_bounds;
  const double diag = std::sqrt((b[3] - b[0]) * (b[3] - b[0]) + (b[4] - b[1]) * (b[4] - b[1]) +
                                (b[5] - b[2]) * (b[5] - b[2]));
  if (!(diag > 0)) throw std::invalid_argument("nerf-hash: empty scene bounds");
  step_size_ = static_cast<float>(diag / options_.steps_per_diagonal);
}

std::vector<ParamGroup> NerfHash::parameter_groups() {
  ParamGroup mlp{"mlp", {}};
  append_parameters(density_layers_, mlp.params);
  append_parameters(color_layers_, mlp.params);
  return {ParamGroup{"hash_grid", {embeddings_}}, mlp};
}

void NerfHash::set_checkpointed_segments(const std::vector<std::string>& names) {
  checkpoint_density_ = checkpoint_color_ = false;
  for (const auto& n : names) {
    if (n == "density_mlp") checkpoint_density_ = true;
    else if (n == "color_mlp") checkpoint_color_ = true;
    else throw std::invalid_argument("nerf-hash: unknown segment '" + n + "'");
  }
}

std::vector<std::pair<std::string, torch::Tensor>> NerfHash::state_tensors() {
  return {{"occupancy_grid", grid_.mutable_values()}};
}

torch::Tensor NerfHash::normalize(const torch::Tensor& positions) const {
  const auto& b = context_.scene_bounds;
  auto lo = torch::tensor({static_cast<float>(b[0]), static_cast<float>(b[1]), static_cast<float>(b[2])});
  auto inv = torch::tensor({static_cast<float>(1.0 / (b[3] - b[0])), static_cast<float>(1.0 / (b[4] - b[1])),
                            static_cast<float>(1.0 / (b[5] - b[2]))});
  return (positions - lo.to(positions.device())) * inv.to(positions.device());
}

// in: {encoded [S, L*F]} -> {features [S, 16]} (feature 0 is the log-density).
std::vector<torch::Tensor> NerfHash::density_mlp(const std::vector<torch::Tensor>& in) const {
  auto h = torch::relu(density_layers_[0](in[0]));
  return {density_layers_[1](h)};
}

// in: {features [S, 16], sh [S, 16]} -> {rgb [S, 3]}.
std::vector<torch::Tensor> NerfHash::color_mlp(const std::vector<torch::Tensor>& in) const {
  auto h = torch::cat({in[0], in[1]}, 1);
  for (size_t i = 0; i + 1 < color_layers_.size(); ++i) h = torch::relu(color_layers_[i](h));
  return {torch::sigmoid(color_layers_.back()(h))};
}

torch::Tensor NerfHash::density(const torch::Tensor& positions) {
  const auto enc = kernels::hash_encoding(normalize(positions), embeddings_, encoding_);
  const auto features = density_mlp({enc})[0];
  return torch::exp(features.select(1, 0).clamp_max(options_.max_log_density));
}

RenderResult NerfHash::render(const RayBatch& rays, const StepContext& context) {
  (void)context;  // marching is deterministic; the grid is the only state it reads
  kernels::RayMarchParams params;
  params.step_size = step_size_;
  params.cone_angle = 0.0f;
  params.max_samples_per_ray = options_.max_samples_per_ray;
  const auto march = kernels::ray_march(rays.origins, rays.directions, rays.near, rays.far,
                                        grid_.aabb(), grid_.bitfield(), params);

  const auto enc = kernels::hash_encoding(normalize(march.positions), embeddings_, encoding_);
  auto fn_density = [this](const std::vector<torch::Tensor>& in) { return density_mlp(in); };
  const auto features = checkpoint_density_ ? checkpoint(fn_density, {enc})[0] : fn_density({enc})[0];
  const auto sigmas = torch::exp(features.select(1, 0).clamp_max(options_.max_log_density));
  const auto sh = spherical_harmonics_deg4(rays.directions).index_select(0, march.ray_indices);
  auto fn_color = [this](const std::vector<torch::Tensor>& in) { return color_mlp(in); };
  const auto rgbs = checkpoint_color_ ? checkpoint(fn_color, {features, sh})[0]
                                      : fn_color({features, sh})[0];

  const auto out = kernels::volume_render(sigmas, rgbs, march.deltas, march.ts, march.ray_offsets);
  RenderResult result;
  result.rgb = out.rgb + (1.0 - out.opacity).unsqueeze(1) * rays.background.view({1, 3});
  result.opacity = out.opacity;
  result.depth = out.depth;
  result.samples = march.ts.size(0);
  return result;
}

std::vector<SegmentInfo> NerfHash::measure_segments(const RayBatch& rays, const StepContext& context) {
  (void)context;
  const auto dev = rays.origins.device();
  kernels::RayMarchParams params;
  params.step_size = step_size_;
  params.cone_angle = 0.0f;
  params.max_samples_per_ray = options_.max_samples_per_ray;
  torch::Tensor enc, sh;
  {
    torch::NoGradGuard no_grad;
    const auto march = kernels::ray_march(rays.origins, rays.directions, rays.near, rays.far,
                                          grid_.aabb(), grid_.bitfield(), params);
    enc = kernels::hash_encoding(normalize(march.positions), embeddings_, encoding_);
    sh = spherical_harmonics_deg4(rays.directions).index_select(0, march.ray_indices);
  }
  auto fn_density = [this](const std::vector<torch::Tensor>& in) { return density_mlp(in); };
  auto fn_color = [this](const std::vector<torch::Tensor>& in) { return color_mlp(in); };
  const SegmentMeasurement density = measure_segment(fn_density, {enc}, dev);
  torch::Tensor features;
  {
    torch::NoGradGuard no_grad;
    features = fn_density({enc})[0];
  }
  const SegmentMeasurement color = measure_segment(fn_color, {features, sh}, dev);
  return {{"density_mlp", density.activation_bytes, density.output_bytes},
          {"color_mlp", color.activation_bytes, color.output_bytes}};
}

void NerfHash::after_step(const StepContext& context, distributed::Communicator& comm) {
  if (options_.grid_update_interval <= 0 || (context.step + 1) % options_.grid_update_interval != 0)
    return;
  // Stored as optical thickness of one marching step (sigma * step), as instant-ngp does, so the
  // threshold does not depend on the scene's scale.
  const float step = step_size_;
  grid_.update([this, step](const torch::Tensor& p) { return density(p) * step; }, context.seed,
               context.step, &comm);
}

std::unique_ptr<Model> make_nerf_hash(const Config& config, const ModelContext& context) {
  return std::make_unique<NerfHash>(NerfHashOptions{}, context, static_cast<uint64_t>(config.run.seed));
}

}  // namespace tessera::models::nerf
