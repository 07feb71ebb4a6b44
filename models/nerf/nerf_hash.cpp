// nerf-hash: hash encoding -> density MLP -> colour MLP, marched through the occupancy grid.
#include "models/nerf/nerf_hash.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/checkpoint.h"
#include "framework/checkpoint_policy.h"
#include "kernels/ray_march.h"
#include "kernels/volume_render.h"
#include "models/nerf/encodings.h"
#include "models/nerf/nerf_config.h"

namespace tessera::models::nerf {

namespace {

// The contracted space [-2, 2]^3 that the grids of unbounded scenes cover.
constexpr std::array<double, 6> kContractedBox{-2, -2, -2, 2, 2, 2};

// L-inf scene contraction (kernels/ray_march.h, RayMarchParams::contract): identity inside
// [-1, 1]^3, (2 - 1/m) p / m outside, m = |p|_inf. [M, 3] -> [M, 3] in [-2, 2]^3.
torch::Tensor contract(const torch::Tensor& p) {
  const torch::Tensor m = std::get<0>(p.abs().max(1, true)).clamp_min(1.0f);
  return p * ((2.0f - 1.0f / m) / m);
}

}  // namespace

int NerfHash::auto_finest_resolution() const {
  if (!(context_.pixel_footprint > 0)) return kFallbackFinestResolution;
  // The grid's side in world units: the contracted cube [-2, 2]^3 is 4 frame half-widths; a
  // bounded grid spans the scene box's longest side.
  double side = 4.0 / frame_scale_;
  if (!contract_) {
    const auto& b = context_.scene_bounds;
    side = std::max({b[3] - b[0], b[4] - b[1], b[5] - b[2]});
  }
  const double cells = std::ceil(kCellsPerPixelFootprint * side / context_.pixel_footprint);
  return static_cast<int>(std::clamp(cells, static_cast<double>(options_.base_resolution),
                                     static_cast<double>(kMaxFinestResolution)));
}

int NerfHash::auto_log2_hashmap_size() const {
  if (context_.train_pixels <= 0) return kFallbackLog2Size;
  const double rows = static_cast<double>(context_.train_pixels) / kPixelsPerRow;
  return std::clamp(static_cast<int>(std::floor(std::log2(rows))), kMinAutoLog2Size, kMaxAutoLog2Size);
}

NerfHash::NerfHash(const NerfHashOptions& options, const ModelContext& context, uint64_t seed)
    : options_(options),
      context_(context),
      grid_(options.grid, context.unbounded() ? kContractedBox : context.scene_bounds,
            context.device) {
  const auto& b = context.scene_bounds;
  const double diag = std::sqrt((b[3] - b[0]) * (b[3] - b[0]) + (b[4] - b[1]) * (b[4] - b[1]) +
                                (b[5] - b[2]) * (b[5] - b[2]));
  if (!(diag > 0)) throw std::invalid_argument("nerf-hash: empty scene bounds");
  contract_ = context.unbounded();
  clip_box_ = torch::empty({6}, torch::kFloat32);
  if (contract_) {
    // The frame: the foreground box's center at the origin and [-1, 1]^3 holding the foreground
    // box and every camera. Space is contracted beyond the cameras (as mip-NeRF 360 and nerfstudio
    // scale captures so that the cameras lie in the unit cube), never between a camera and the
    // object it looks at: contracted cells are long in the direction away from the center, so
    // density there would be seen from the cameras as streaks converging on the scene center.
    double half = 0;
    for (int a = 0; a < 3; ++a) {
      frame_center_[a] = static_cast<float>(0.5 * (b[a] + b[a + 3]));
      half = std::max(half, 0.5 * (b[a + 3] - b[a]));
    }
    const auto& cams = context.camera_bounds;
    if (cams != std::array<double, 6>{})
      for (int a = 0; a < 3; ++a)
        half = std::max({half, std::abs(cams[a] - frame_center_[a]),
                         std::abs(cams[a + 3] - frame_center_[a])});
    frame_scale_ = static_cast<float>(1.0 / half);
    for (int i = 0; i < 6; ++i)
      clip_box_[i] = static_cast<float>((context.scene_extent[i] - frame_center_[i % 3]) * frame_scale_);
    step_size_ = static_cast<float>(2.0 * std::sqrt(3.0) / options_.steps_per_diagonal);
  } else {
    for (int i = 0; i < 6; ++i) clip_box_[i] = static_cast<float>(b[i]);
    step_size_ = static_cast<float>(diag / options_.steps_per_diagonal);
  }
  if (options_.finest_resolution == 0) options_.finest_resolution = auto_finest_resolution();
  if (options_.log2_hashmap_size == 0) options_.log2_hashmap_size = auto_log2_hashmap_size();
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
  // Drawn after the radiance field's: the grid sampler's model starts the same either way.
  if (options_.sampler == "proposal") {
    ProposalOptions proposal = options_.proposal;
    proposal.max_log_density = options_.max_log_density;
    proposal_ = std::make_unique<ProposalSampler>(proposal, gen, context.device);
  }
}

torch::Tensor NerfHash::to_frame(const torch::Tensor& world) const {
  if (!contract_) return world;
  const auto center = torch::tensor({frame_center_[0], frame_center_[1], frame_center_[2]})
                          .to(world.device());
  return (world - center) * frame_scale_;
}

std::vector<ParamGroup> NerfHash::parameter_groups() {
  ParamGroup mlp{"mlp", {}};
  append_parameters(density_layers_, mlp.params);
  append_parameters(color_layers_, mlp.params);
  std::vector<ParamGroup> groups{ParamGroup{"hash_grid", {embeddings_}}, mlp};
  if (proposal_) groups.push_back(ParamGroup{"proposal", proposal_->parameters()});
  return groups;
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
  if (contract_) return (contract(positions) + 2.0f) * 0.25f;
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
  const auto enc = encode(normalize(to_frame(positions)));
  const auto features = density_mlp({enc})[0];
  return torch::exp(features.select(1, 0).clamp_max(options_.max_log_density));
}

torch::Tensor NerfHash::grid_density(const torch::Tensor& grid_positions) {
  // Contracted grid positions are already in [-2, 2]^3: contract() leaves them unchanged
  // except for rounding at |q| > 1, so map them straight to [0, 1]^3.
  const auto unit = contract_ ? (grid_positions + 2.0f) * 0.25f : normalize(grid_positions);
  const auto enc = encode(unit);
  const auto features = density_mlp({enc})[0];
  return torch::exp(features.select(1, 0).clamp_max(options_.max_log_density));
}

kernels::RayMarchOutput NerfHash::march(const RayBatch& rays, const StepContext* context) const {
  kernels::RayMarchParams params;
  params.step_size = step_size_;
  params.cone_angle = contract_ ? options_.unbounded_cone_angle : 0.0f;
  params.contract = contract_;
  params.max_samples_per_ray = options_.max_samples_per_ray;
  // t, deltas and near/far are in marching units (near_far).
  const torch::Tensor origins = to_frame(rays.origins);
  auto [near, far] = near_far(rays);
  if (options_.march_jitter && context != nullptr && context->training && rays.ray_ids.defined() &&
      near.numel() > 0) {
    // The march starts at max(near, where the ray enters the clip box) (kernels/ray_march.h,
    // rule 3); starting it u * dt later moves every sample by a fraction of its step.
    const auto start = torch::maximum(near, clip_span(origins, rays.directions).first);
    auto dt = torch::full_like(start, step_size_);
    if (params.cone_angle > 0) dt = torch::maximum(start * params.cone_angle, dt);
    const auto u = ray_uniforms(rays.ray_ids, context->seed, context->step,
                                RandomPurpose::kMarchJitter, 1).squeeze(1);
    near = start + u.to(start.device()) * dt;
  }
  return kernels::ray_march(origins, rays.directions, near, far, clip_box_, grid_.bitfield(), params);
}

std::pair<torch::Tensor, torch::Tensor> NerfHash::clip_span(const torch::Tensor& origins,
                                                            const torch::Tensor& directions) const {
  const auto box = clip_box_.to(origins.device());
  const auto lo = box.slice(0, 0, 3), hi = box.slice(0, 3, 6);
  const auto inv = 1.0f / directions;  // +-inf on axes the ray runs along
  const auto t0 = (lo - origins) * inv, t1 = (hi - origins) * inv;
  // An axis the ray runs along does not bound it (0 * inf would be NaN there), unless the ray
  // lies outside that axis's slab: then it never enters.
  const auto along = directions == 0;
  const auto outside = along & ((origins < lo) | (origins > hi));
  const auto enter = torch::where(along, torch::full_like(t0, -INFINITY), torch::minimum(t0, t1));
  auto leave = torch::where(along, torch::full_like(t0, INFINITY), torch::maximum(t0, t1));
  leave = torch::where(outside, torch::full_like(t0, -INFINITY), leave);
  return {std::get<0>(enter.max(1)), std::get<0>(leave.min(1))};
}

std::pair<torch::Tensor, torch::Tensor> NerfHash::near_far(const RayBatch& rays) const {
  // Marching space is world scaled by frame_scale_ when unbounded: distances along the (unit)
  // directions scale alike.
  if (!contract_) return {rays.near, rays.far};
  return {rays.near * frame_scale_, rays.far * frame_scale_};
}

ProposalSamples NerfHash::propose(const RayBatch& rays, const StepContext* context) const {
  const torch::Tensor origins = to_frame(rays.origins);
  const auto [near, far] = near_far(rays);
  const auto [enter, leave] = clip_span(origins, rays.directions);
  // A ray that misses the box (or ends before it) gets an empty span at its near plane: samples
  // of no length, no weight, the background.
  const torch::Tensor miss = torch::maximum(near, enter) >= torch::minimum(far, leave);
  const torch::Tensor t_near = torch::where(miss, near, torch::maximum(near, enter));
  const torch::Tensor t_far = torch::where(miss, near, torch::minimum(far, leave));
  torch::Tensor uniforms;
  if (context != nullptr && context->training && rays.ray_ids.defined())
    uniforms = ray_uniforms(rays.ray_ids, context->seed, context->step,
                            RandomPurpose::kProposalJitter, 3).to(origins.device());
  return proposal_->sample(origins, rays.directions, t_near, t_far,
                           [this](const torch::Tensor& p) { return normalize(p); }, uniforms,
                           context != nullptr ? context->step : 0);
}

namespace {

// The samples `index` [K] (ascending) of `march`, repacked per ray; `counts` [R] is how many
// each ray keeps.
kernels::RayMarchOutput select_samples(const kernels::RayMarchOutput& march, const torch::Tensor& index,
                                       const torch::Tensor& counts) {
  kernels::RayMarchOutput out;
  out.ray_offsets = torch::cat({torch::zeros({1}, counts.options()), counts.cumsum(0)});
  out.ts = march.ts.index_select(0, index);
  out.deltas = march.deltas.index_select(0, index);
  out.positions = march.positions.index_select(0, index);
  out.ray_indices = march.ray_indices.index_select(0, index);
  return out;
}

}  // namespace

torch::Tensor NerfHash::encode(const torch::Tensor& unit) const {
  auto enc = kernels::hash_encoding(unit, embeddings_, encoding_);
  if (level_weights_.defined()) enc = enc * level_weights_;
  return enc;
}

void NerfHash::set_step(int64_t step) {
  if (step == weights_step_ && total_steps_ == weights_total_steps_) return;  // every render call
  weights_step_ = step;
  weights_total_steps_ = total_steps_;
  const int levels = options_.levels;
  const double ramp = static_cast<double>(options_.coarse_to_fine) * static_cast<double>(total_steps_);
  const double start = std::ceil(levels / 3.0);
  const double on = ramp > 0 ? start + (levels - start) * std::min(1.0, step / ramp) : levels;
  if (on >= levels) {
    level_weights_ = torch::Tensor();
    return;
  }
  auto weights = torch::empty({levels, options_.features_per_level}, torch::kFloat32);
  for (int l = 0; l < levels; ++l) weights[l].fill_(std::clamp(on - l, 0.0, 1.0));
  level_weights_ = weights.reshape({-1}).to(context_.device);
}

torch::Tensor NerfHash::occlusion_counts(const kernels::RayMarchOutput& march, const torch::Tensor& local,
                                        torch::Tensor* features_out) const {
  const int64_t marched = march.ts.size(0);
  const auto opts = march.ray_offsets.options();
  // Densities of the samples evaluated so far; 0 (nothing) behind them, so volume_render's count
  // of a ray is final once it stops within them: transmittance is the same product up to there.
  auto sigmas = torch::zeros({marched}, march.ts.options().dtype(torch::kFloat32));
  const auto rgb_unused = torch::zeros({marched, 3}, sigmas.options());
  torch::Tensor counts;
  torch::Tensor active;  // [marched] bool: samples of rays still going (undefined: all)
  int64_t begin = 0;
  for (int64_t chunk = occlusion_chunk_; ; chunk *= 2) {
    torch::Tensor round = occlusion_chunk_ > 0 ? (local >= begin) & (local < begin + chunk)
                                               : torch::ones({marched}, opts.dtype(torch::kBool));
    if (active.defined()) round = round & active;
    const auto index = round.nonzero().squeeze(1);
    if (index.numel() > 0) {
      const auto enc = encode(normalize(march.positions.index_select(0, index)));
      const auto f = density_mlp({enc})[0];
      sigmas.index_copy_(0, index, torch::exp(f.select(1, 0).to(torch::kFloat32)
                                                 .clamp_max(options_.max_log_density)));
      if (features_out) {
        if (!features_out->defined()) *features_out = torch::zeros({marched, f.size(1)}, f.options());
        features_out->index_copy_(0, index, f);
      }
    }
    counts = kernels::volume_render(sigmas, rgb_unused, march.deltas, march.ts, march.ray_offsets)
                 .num_steps;
    if (occlusion_chunk_ <= 0) break;
    begin += chunk;
    // A ray goes on while its count runs past what was evaluated: it has not stopped there.
    const auto going = counts > begin;  // [R]
    if (!going.any().item<bool>()) break;
    active = going.index_select(0, march.ray_indices);
  }
  if (features_out && !features_out->defined())  // no samples
    *features_out = torch::zeros({0, options_.geo_features}, sigmas.options());
  return counts;
}

RenderResult NerfHash::render(const RayBatch& rays, const StepContext& context) {
  set_step(context.step);
  // Marching reads the grid and, with march_jitter in training, (seed, step, ray id): the same
  // samples on any rank and batch split; so does the proposal sampler. The context also times
  // the phases.
  ProposalSamples proposal;
  kernels::RayMarchOutput march;
  if (proposal_) {
    proposal = propose(rays, &context);
    march = proposal.samples;
  } else {
    march = this->march(rays, &context);
  }
  const int64_t marched = march.ts.size(0);
  lap(context, "march");

  // Occluded samples (docs/nerf.md, nerf-hash step 5): the occupancy grid cannot know
  // what lies in front of a cell, so a ray through a room marches every occupied cell behind the
  // first wall. A density pass without gradient finds where each ray's transmittance falls
  // below volume_render's threshold; only the samples before that point are rendered (and, in
  // training, differentiated). Their colour is what it would be with all samples: volume_render
  // stops at the same sample either way.
  torch::Tensor features;  // of the kept samples, when already known (no gradient needed)
  const bool differentiate = torch::GradMode::is_enabled();
  if (skip_occluded_ && !proposal_) {  // the proposal's few samples are all rendered (nerfacto)
    torch::NoGradGuard no_grad;
    torch::Tensor all_features;  // [marched, geo_features] where evaluated (eval only)
    const auto local = torch::arange(marched, march.ray_offsets.options()) -
                       march.ray_offsets.index_select(0, march.ray_indices);  // index within its ray
    const auto counts = occlusion_counts(march, local, differentiate ? nullptr : &all_features);
    const auto kept = (local < counts.index_select(0, march.ray_indices)).nonzero().squeeze(1);
    march = select_samples(march, kept, counts);
    if (!differentiate) features = all_features.index_select(0, kept);
    lap(context, "march");  // the occluded samples are found as part of marching
  }

  auto fn_density = [this](const std::vector<torch::Tensor>& in) { return density_mlp(in); };
  CheckpointOptions checkpointing;
  checkpointing.phases = context.phases;  // recomputes charged as "recompute"
  if (!features.defined()) {
    const auto enc = encode(normalize(march.positions));
    lap(context, "encode");
    features = checkpoint_density_ ? checkpoint(fn_density, {enc}, checkpointing)[0]
                                   : fn_density({enc})[0];
  }
  // Compositing runs in float32 (under bf16/fp16 autocast the MLPs' outputs are half).
  auto sigmas =
      torch::exp(features.select(1, 0).to(torch::kFloat32).clamp_max(options_.max_log_density));
  const auto sh = spherical_harmonics_deg4(rays.directions).index_select(0, march.ray_indices);
  auto fn_color = [this](const std::vector<torch::Tensor>& in) { return color_mlp(in); };
  auto rgbs = (checkpoint_color_ ? checkpoint(fn_color, {features, sh}, checkpointing)[0]
                                 : fn_color({features, sh})[0]).to(torch::kFloat32);
  if (contract_ && options_.near_gradient_distance > 0 && differentiate) {
    // Same values, gradients scaled by s: x * s + detach(x) * (1 - s).
    auto scale_gradient = [](const torch::Tensor& x, const torch::Tensor& s) {
      return x * s + x.detach() * (1.0f - s);
    };
    const auto s = (march.ts / options_.near_gradient_distance).square().clamp_max(1.0f);
    sigmas = scale_gradient(sigmas, s);
    rgbs = scale_gradient(rgbs, s.unsqueeze(1));
  }
  lap(context, "mlp");

  const auto out = kernels::volume_render(sigmas, rgbs, march.deltas, march.ts, march.ray_offsets);
  RenderResult result;
  torch::Tensor background = rays.background.reshape({-1, 3});
  if (contract_ && rays.last_sample_background && march.ts.size(0) > 0) {
    const auto ends = march.ray_offsets.slice(0, 1);  // [R]: one past each ray's last sample
    const auto has_sample = (ends > march.ray_offsets.slice(0, 0, -1)).unsqueeze(1);
    background = torch::where(has_sample, rgbs.index_select(0, (ends - 1).clamp_min(0)), background);
  }
  result.rgb = out.rgb + (1.0 - out.opacity).unsqueeze(1) * background;
  result.opacity = out.opacity;
  result.depth = contract_ ? out.depth / frame_scale_ : out.depth;  // world units
  result.samples = marched;
  result.samples_rendered = march.ts.size(0);
  if (options_.distortion_weight > 0 && differentiate) {
    // In the lin-disp distance; the proposal sampler's own s, normalized over each ray's span
    // (nerfacto's), where it placed the samples.
    torch::Tensor s_begin, s_end;
    if (proposal_) {
      s_begin = proposal.nerf_edges.slice(1, 0, -1).reshape({-1});
      s_end = proposal.nerf_edges.slice(1, 1).reshape({-1});
    } else {
      const auto half = march.deltas * 0.5f;
      s_begin = lin_disp_distance(march.ts - half);
      s_end = lin_disp_distance(march.ts + half);
    }
    result.regularization =
        options_.distortion_weight *
        distortion_loss(out.weights, s_begin, s_end, march.ray_offsets, march.ray_indices).sum();
  }
  if (options_.weight_decay > 0 && differentiate) {
    // regularization is summed over the batch's rays and divided by the step's global ray count,
    // so weighting the decay by this batch's rays adds it once per step over every micro-batch
    // and rank.
    auto decay = (options_.weight_decay * static_cast<double>(rays.origins.size(0))) *
                 embeddings_.square().mean({1, 2}).sum();
    result.regularization = result.regularization.defined() ? result.regularization + decay : decay;
  }
  if (proposal_ && options_.proposal.interlevel_weight > 0 && differentiate) {
    // Summed over the batch's rays, as the photometric loss and the distortion loss.
    auto interlevel = options_.proposal.interlevel_weight *
                      proposal_->interlevel_loss(proposal, out.weights).sum();
    result.regularization =
        result.regularization.defined() ? result.regularization + interlevel : interlevel;
  }
  lap(context, "composite");
  return result;
}

std::vector<SegmentInfo> NerfHash::measure_segments(const RayBatch& rays, const StepContext& context) {
  (void)context;
  const auto dev = rays.origins.device();
  torch::Tensor enc, sh;
  {
    torch::NoGradGuard no_grad;
    const auto march = proposal_ ? propose(rays).samples : this->march(rays);
    enc = encode(normalize(march.positions));
    sh = spherical_harmonics_deg4(rays.directions).index_select(0, march.ray_indices);
  }
  auto fn_density = [this](const std::vector<torch::Tensor>& in) { return density_mlp(in); };
  CheckpointOptions checkpointing;
  checkpointing.phases = context.phases;  // recomputes charged as "recompute"
  auto fn_color = [this](const std::vector<torch::Tensor>& in) { return color_mlp(in); };
  const SegmentMeasurement density = measure_segment(fn_density, {enc}, dev);
  torch::Tensor features;
  {
    torch::NoGradGuard no_grad;
    features = fn_density({enc})[0];
  }
  const SegmentMeasurement color = measure_segment(fn_color, {features, sh}, dev);
  return {{"density_mlp", density.activation_bytes, density.output_bytes, density.forward_seconds},
          {"color_mlp", color.activation_bytes, color.output_bytes, color.forward_seconds}};
}

void NerfHash::after_step(const StepContext& context, distributed::Communicator& comm) {
  set_step(context.step);
  if (proposal_) return;  // the grid is not used
  if (options_.grid_update_interval <= 0 || (context.step + 1) % options_.grid_update_interval != 0)
    return;
  // Stored as optical thickness (sigma * step), as instant-ngp does, so the threshold does not
  // depend on the scene's scale; the step is instant-ngp's reference step (diagonal / 1024), not
  // the coarser one marched here, so that the same densities are pruned as there.
  const float step = step_size_ * static_cast<float>(options_.steps_per_diagonal) /
                     static_cast<float>(options_.grid_reference_steps);
  grid_.update([this, step](const torch::Tensor& p) { return grid_density(p) * step; }, context.seed,
               context.step, &comm);
}

std::unique_ptr<Model> make_nerf_hash(const Config& config, const ModelContext& context) {
  const NerfConfig& nerf = config.section<NerfConfig>();
  check_nerf_config(nerf, config.source_path);
  const NerfHashOptions& options = nerf.hash;
  auto model = std::make_unique<NerfHash>(options, context, static_cast<uint64_t>(config.run.seed));
  if (options.finest_resolution == 0)
    spdlog::info("nerf-hash: finest resolution {} from the images (a pixel spans {:.4g} world units "
                 "at the foreground's center; nerf.hash_max_resolution = 0)",
                 model->finest_resolution(), context.pixel_footprint);
  if (options.log2_hashmap_size == 0)
    spdlog::info("nerf-hash: 2^{} rows per level from the images ({} training pixels, at least 10 per row; "
                 "nerf.hash_log2_size = 0)",
                 model->log2_hashmap_size(), context.train_pixels);
  return model;
}

}  // namespace tessera::models::nerf
