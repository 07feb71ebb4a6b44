// nerf-mlp: the classic NeRF MLP with stratified sampling and volume rendering.
#include "models/nerf/nerf_mlp.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "framework/checkpoint.h"
#include "framework/checkpoint_policy.h"
#include "kernels/volume_render.h"
#include "models/nerf/encodings.h"
#include "models/nerf/nerf_config.h"

namespace tessera::models::nerf {

std::vector<int> plan_trunk_segments(const NerfMlpOptions& o, int64_t x_width, int64_t d_width) {
  // The cost model, in floats stored per sample: layer i keeps its ReLU output (width), and the
  // skip layer also its concatenated input (width + x_width); the heads keep [features, encoded
  // direction] and the colour layer's ReLU output; a segment boundary keeps one width.
  // With every segment checkpointed, backward through segment k holds the k earlier boundaries
  // plus segment k's recomputed activations; through the heads, every boundary plus the heads.
  const int n = o.layers;
  const double width = static_cast<double>(o.width);
  const double heads = width + static_cast<double>(d_width) + static_cast<double>(o.color_width);
  std::vector<double> cost(n, width);
  if (o.skip_layer >= 0 && o.skip_layer < n) cost[o.skip_layer] += width + static_cast<double>(x_width);
  auto peak_of = [&](const std::vector<int>& begin) {
    const int segments = static_cast<int>(begin.size()) - 1;
    double peak = segments * width + heads;
    for (int k = 0; k < segments; ++k) {
      double stored = k * width;
      for (int i = begin[k]; i < begin[k + 1]; ++i) stored += cost[i];
      peak = std::max(peak, stored);
    }
    return peak;
  };
  // Exhaustive over the 2^(n-1) ways to cut the trunk (n <= 16); ties go to fewer segments.
  // Deeper trunks take segments of ceil(sqrt(n)) layers, the classic sqrt(n) trade.
  std::vector<int> best;
  if (n <= 16) {
    double best_peak = 0.0;
    for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
      std::vector<int> begin{0};
      for (int i = 1; i < n; ++i)
        if (cuts & (1u << (i - 1))) begin.push_back(i);
      begin.push_back(n);
      const double peak = peak_of(begin);
      if (best.empty() || peak < best_peak || (peak == best_peak && begin.size() < best.size())) {
        best = begin;
        best_peak = peak;
      }
    }
  } else {
    const int per_segment = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n))));
    for (int b = 0; b < n; b += per_segment) best.push_back(b);
    best.push_back(n);
  }
  return best;
}

NerfMlp::NerfMlp(const NerfMlpOptions& options, const ModelContext& context, uint64_t seed)
    : options_(options), context_(context) {
  if (options_.layers < 1) throw std::invalid_argument("nerf-mlp: layers must be >= 1");
  if (options_.skip_layer < 1 || options_.skip_layer >= options_.layers)
    throw std::invalid_argument("nerf-mlp: skip_layer must be in [1, layers)");
  if (options_.samples_per_ray < 1) throw std::invalid_argument("nerf-mlp: samples_per_ray < 1");
  auto gen = make_generator({seed, static_cast<uint64_t>(RandomPurpose::kInit)});
  const auto dev = context.device;
  const int64_t x_width = positional_encoding_width(3, options_.position_frequencies);
  const int64_t d_width = positional_encoding_width(3, options_.direction_frequencies);
  for (int i = 0; i < options_.layers; ++i) {
    const int64_t in = i == 0 ? x_width : (i == options_.skip_layer ? options_.width + x_width : options_.width);
    trunk_.push_back(make_dense(in, options_.width, gen, dev));
  }
  sigma_head_ = make_dense(options_.width, 1, gen, dev);
  feature_ = make_dense(options_.width, options_.width, gen, dev);
  color_hidden_ = make_dense(options_.width + d_width, options_.color_width, gen, dev);
  color_out_ = make_dense(options_.color_width, 3, gen, dev);
  segment_begin_ = plan_trunk_segments(options_, x_width, d_width);
  checkpointed_.assign(num_trunk_segments() + 1, false);
}

std::vector<ParamGroup> NerfMlp::parameter_groups() {
  ParamGroup mlp{"mlp", {}};
  append_parameters(trunk_, mlp.params);
  append_parameters({sigma_head_, feature_, color_hidden_, color_out_}, mlp.params);
  return {mlp};
}

std::vector<std::string> NerfMlp::segment_names() const {
  std::vector<std::string> names;
  for (int k = 0; k < num_trunk_segments(); ++k) names.push_back("mlp" + std::to_string(k));
  names.push_back("heads");
  return names;
}

void NerfMlp::set_checkpointed_segments(const std::vector<std::string>& names) {
  const auto all = segment_names();
  std::fill(checkpointed_.begin(), checkpointed_.end(), false);
  for (const auto& n : names) {
    const auto it = std::find(all.begin(), all.end(), n);
    if (it == all.end()) throw std::invalid_argument("nerf-mlp: unknown segment '" + n + "'");
    checkpointed_[it - all.begin()] = true;
  }
}

std::vector<torch::Tensor> NerfMlp::trunk_segment(int k, const std::vector<torch::Tensor>& in) const {
  auto h = in[0];
  for (int i = segment_begin_[k]; i < segment_begin_[k + 1]; ++i) {
    if (i == options_.skip_layer) h = torch::cat({h, in[1]}, 1);
    h = torch::relu(trunk_[i](i == 0 ? in[1] : h));
  }
  return {h};
}

std::vector<torch::Tensor> NerfMlp::heads(const std::vector<torch::Tensor>& in) const {
  const auto sigma_raw = sigma_head_(in[0]);
  const auto feat = feature_(in[0]);
  const auto c = torch::relu(color_hidden_(torch::cat({feat, in[1]}, 1)));
  return {sigma_raw, torch::sigmoid(color_out_(c))};
}

torch::Tensor NerfMlp::sample_offsets(const RayBatch& rays, const StepContext& context) const {
  const int64_t r = rays.origins.size(0), s = options_.samples_per_ray;
  if (!context.training) return torch::full({r, s}, 0.5f, torch::kFloat32);
  return ray_uniforms(rays.ray_ids, context.seed, context.step, RandomPurpose::kSampleJitter, s);
}

NerfMlp::Samples NerfMlp::prepare(const RayBatch& rays, const StepContext& context) const {
  const auto dev = rays.origins.device();
  const int64_t r = rays.origins.size(0), s = options_.samples_per_ray;
  // Bin j of ray r spans near + (far - near) * [j, j + 1) / S; the sample sits at offset u in it.
  const auto bins = torch::arange(s, torch::TensorOptions().dtype(torch::kFloat32).device(dev)).view({1, s});
  const auto u = sample_offsets(rays, context).to(dev);
  const auto near = rays.near.view({r, 1}), far = rays.far.view({r, 1});
  const auto ts = near + (far - near) * ((bins + u) / static_cast<float>(s));  // [R, S]
  const auto deltas = torch::cat({ts.slice(1, 1) - ts.slice(1, 0, s - 1), far - ts.slice(1, s - 1)}, 1);
  const auto points = rays.origins.view({r, 1, 3}) + ts.unsqueeze(2) * rays.directions.view({r, 1, 3});
  lap(context, "march");  // the stratified samples along each ray

  // Positions to [-1, 1]^3 by the scene box, so the encoding's frequencies are relative to it.
  const auto& b = context_.scene_bounds;
  auto center = torch::tensor({float((b[0] + b[3]) / 2), float((b[1] + b[4]) / 2), float((b[2] + b[5]) / 2)});
  auto inv_half = torch::tensor({float(2.0 / (b[3] - b[0])), float(2.0 / (b[4] - b[1])), float(2.0 / (b[5] - b[2]))});
  const auto xn = (points.reshape({r * s, 3}) - center.to(dev)) * inv_half.to(dev);
  const auto x_enc = positional_encoding(xn, options_.position_frequencies);
  const auto d_enc = positional_encoding(rays.directions, options_.direction_frequencies)
                         .repeat_interleave(s, 0);
  lap(context, "encode");
  return {ts, deltas, x_enc, d_enc};
}

std::vector<SegmentInfo> NerfMlp::measure_segments(const RayBatch& rays, const StepContext& context) {
  const auto dev = rays.origins.device();
  Samples p;
  {
    torch::NoGradGuard no_grad;
    p = prepare(rays, context);
  }
  std::vector<SegmentInfo> infos;
  const auto names = segment_names();
  torch::Tensor h = torch::zeros({0}, p.x_enc.options());
  const int segments = num_trunk_segments();
  for (int k = 0; k < segments; ++k) {
    auto fn = [this, k](const std::vector<torch::Tensor>& in) { return trunk_segment(k, in); };
    const SegmentMeasurement m = measure_segment(fn, {h, p.x_enc}, dev);
    infos.push_back({names[k], m.activation_bytes, m.output_bytes, m.forward_seconds});
    torch::NoGradGuard no_grad;
    h = fn({h, p.x_enc})[0];  // the next segment's input
  }
  auto fn_heads = [this](const std::vector<torch::Tensor>& in) { return heads(in); };
  const SegmentMeasurement m = measure_segment(fn_heads, {h, p.d_enc}, dev);
  infos.push_back({names[segments], m.activation_bytes, m.output_bytes, m.forward_seconds});
  return infos;
}

RenderResult NerfMlp::render(const RayBatch& rays, const StepContext& context) {
  const auto dev = rays.origins.device();
  const int64_t r = rays.origins.size(0), s = options_.samples_per_ray;
  const Samples p = prepare(rays, context);
  const auto& ts = p.ts;
  const auto& deltas = p.deltas;
  const auto& x_enc = p.x_enc;
  const auto& d_enc = p.d_enc;

  torch::Tensor h = torch::zeros({0}, x_enc.options());  // segment 0 reads the encoding only
  CheckpointOptions checkpointing;
  checkpointing.phases = context.phases;  // recomputes charged as "recompute"
  const int segments = num_trunk_segments();
  for (int k = 0; k < segments; ++k) {
    auto fn = [this, k](const std::vector<torch::Tensor>& in) { return trunk_segment(k, in); };
    h = checkpointed_[k] ? checkpoint(fn, {h, x_enc}, checkpointing)[0] : fn({h, x_enc})[0];
  }
  auto fn_heads = [this](const std::vector<torch::Tensor>& in) { return heads(in); };
  const auto out_heads = checkpointed_[segments] ? checkpoint(fn_heads, {h, d_enc}, checkpointing)
                                                 : fn_heads({h, d_enc});
  lap(context, "mlp");
  // softplus instead of the paper's ReLU: no dead density at init, smoother on a short CPU run.
  // Compositing runs in float32 (under bf16/fp16 autocast the heads' outputs are half).
  const auto sigmas = torch::softplus(out_heads[0].view({-1}).to(torch::kFloat32));
  const auto offsets = torch::arange(0, (r + 1) * s, s, torch::TensorOptions().dtype(torch::kInt64).device(dev));
  const auto vr = kernels::volume_render(sigmas, out_heads[1].to(torch::kFloat32), deltas.reshape({-1}), ts.reshape({-1}), offsets);
  RenderResult result;
  result.rgb = vr.rgb + (1.0 - vr.opacity).unsqueeze(1) * rays.background.reshape({-1, 3});
  result.opacity = vr.opacity;
  result.depth = vr.depth;
  result.samples = r * s;
  lap(context, "composite");
  return result;
}

std::unique_ptr<Model> make_nerf_mlp(const Config& config, const ModelContext& context) {
  const NerfConfig& nerf = config.section<NerfConfig>();
  check_nerf_config(nerf, config.source_path);
  return std::make_unique<NerfMlp>(nerf.mlp, context, static_cast<uint64_t>(config.run.seed));
}

}  // namespace tessera::models::nerf
