// nerf-hash's proposal sampler (see proposal_sampler.h): nerfacto's two proposal density fields,
// its spacing, its PDF sampler and mip-NeRF 360's interlevel loss, in batched tensor ops.
#include "models/nerf/proposal_sampler.h"

#include <algorithm>

namespace tessera::models::nerf {

namespace {

// nerfacto's proposal fields: 5 levels of F = 2, N_min 16, N_max 128 and 256, one hidden layer
// of 16.
constexpr int kLevels = 5;
constexpr int kFeatures = 2;
constexpr int kBaseResolution = 16;
constexpr int kFinestResolution[2] = {128, 256};
constexpr int64_t kHidden = 16;
constexpr float kEmbeddingInit = 1e-4f;  // as nerf-hash's table
// nerfacto's PDF sampler adds this much weight to every interval, so that every part of a ray
// keeps some samples; the interlevel loss's epsilon.
constexpr float kHistogramPadding = 0.01f;
constexpr float kInterlevelEps = 1e-7f;
constexpr double kAnnealSlope = 10.0;

// g^-1(x) for x in [0, 1), g = lin_disp_distance (nerfacto's UniformLinDispPiecewiseSampler).
torch::Tensor lin_disp_inverse(const torch::Tensor& x) {
  return torch::where(x < 0.5f, x * 2.0f, 0.5f / (1.0f - x).clamp_min(1e-6f));
}

// [R, n + 1] interval edges in s, evenly spaced; with `u` [R, 1], every inner edge moves by
// (u - 1/2) of an interval, the first and last toward the inside (nerfacto's single jitter).
torch::Tensor uniform_edges(int64_t rays, int64_t n, const torch::Tensor& u,
                            const torch::TensorOptions& options) {
  const torch::Tensor bins = torch::linspace(0.0, 1.0, n + 1, options).unsqueeze(0).expand({rays, n + 1});
  if (!u.defined()) return bins.contiguous();
  const torch::Tensor centers = (bins.slice(1, 1) + bins.slice(1, 0, -1)) * 0.5f;
  const torch::Tensor upper = torch::cat({centers, bins.slice(1, n)}, 1);
  const torch::Tensor lower = torch::cat({bins.slice(1, 0, 1), centers}, 1);
  return lower + (upper - lower) * u;
}

// n samples' edges [R, n + 1] drawn by inverse transform from the histogram `weights` [R, k] over
// `edges` [R, k + 1] (nerfacto's PDFSampler, without the original edges): quantiles evenly
// spaced, moved together by u [R, 1] of a quantile step (training) or centred (undefined).
torch::Tensor pdf_edges(const torch::Tensor& edges, const torch::Tensor& weights, int64_t n,
                        const torch::Tensor& u) {
  const int64_t rays = weights.size(0), k = weights.size(1), bins = n + 1;
  torch::Tensor w = weights + kHistogramPadding;
  torch::Tensor sum = w.sum(1, true);
  const torch::Tensor pad = torch::relu(1e-5f - sum);
  w = w + pad / static_cast<double>(k);
  sum = sum + pad;
  torch::Tensor cdf = torch::cumsum(w / sum, 1).clamp_max(1.0f);
  cdf = torch::cat({torch::zeros({rays, 1}, cdf.options()), cdf}, 1).contiguous();  // [R, k + 1]
  const torch::Tensor base =
      torch::linspace(0.0, 1.0 - 1.0 / static_cast<double>(bins), bins, cdf.options())
          .unsqueeze(0)
          .expand({rays, bins});
  const torch::Tensor q = (u.defined() ? base + u / static_cast<double>(bins)
                                       : base + 0.5 / static_cast<double>(bins))
                              .contiguous();
  const torch::Tensor above_index = torch::searchsorted(cdf, q, /*out_int32=*/false, /*right=*/true);
  const torch::Tensor below = (above_index - 1).clamp(0, k), above = above_index.clamp(0, k);
  const torch::Tensor cdf0 = cdf.gather(1, below), cdf1 = cdf.gather(1, above);
  const torch::Tensor e0 = edges.gather(1, below), e1 = edges.gather(1, above);
  const torch::Tensor f = torch::nan_to_num((q - cdf0) / (cdf1 - cdf0), 0.0).clamp(0.0, 1.0);
  return e0 + f * (e1 - e0);
}

// Alpha-compositing weights [R, n] of densities over intervals of lengths `deltas` [R, n].
torch::Tensor composite_weights(const torch::Tensor& sigma, const torch::Tensor& deltas) {
  const torch::Tensor optical = sigma * deltas;
  const torch::Tensor before =  // exclusive sums (not cumsum - optical, which a large term rounds)
      torch::cat({torch::zeros({optical.size(0), 1}, optical.options()),
                  torch::cumsum(optical, 1).slice(1, 0, -1)}, 1);
  return (1.0f - torch::exp(-optical)) * torch::exp(-before);
}

}  // namespace

double ProposalSampler::anneal(int64_t step) {
  const double x = std::clamp(static_cast<double>(step) / kAnnealSteps, 0.0, 1.0);
  return kAnnealSlope * x / ((kAnnealSlope - 1.0) * x + 1.0);
}

ProposalSampler::ProposalSampler(const ProposalOptions& options, at::Generator& generator,
                                 torch::Device device)
    : options_(options) {
  for (int finest : kFinestResolution) {
    Field f;
    f.encoding.levels = kLevels;
    f.encoding.features_per_level = kFeatures;
    f.encoding.log2_hashmap_size = options_.log2_hashmap_size;
    f.encoding.base_resolution = kBaseResolution;
    f.encoding.per_level_scale = kernels::hash_encoding_per_level_scale(kBaseResolution, finest, kLevels);
    f.table = (torch::rand({kLevels, int64_t{1} << options_.log2_hashmap_size, kFeatures}, generator,
                           torch::TensorOptions().dtype(torch::kFloat32)) *
                   (2.0 * kEmbeddingInit) -
               kEmbeddingInit)
                  .to(device)
                  .set_requires_grad(true);
    f.hidden = make_dense(int64_t{kLevels} * kFeatures, kHidden, generator, device);
    f.out = make_dense(kHidden, 1, generator, device);
    fields_.push_back(std::move(f));
  }
}

std::vector<torch::Tensor> ProposalSampler::parameters() const {
  std::vector<torch::Tensor> out;
  for (const Field& f : fields_) {
    out.push_back(f.table);
    append_parameters({f.hidden, f.out}, out);
  }
  return out;
}

torch::Tensor ProposalSampler::density(const Field& field, const torch::Tensor& unit) const {
  const torch::Tensor enc = kernels::hash_encoding(unit, field.table, field.encoding);
  const torch::Tensor x = field.out(torch::relu(field.hidden(enc))).squeeze(1);
  return torch::exp(x.clamp_max(options_.max_log_density));
}

ProposalSamples ProposalSampler::sample(const torch::Tensor& origins, const torch::Tensor& directions,
                                        const torch::Tensor& t_near, const torch::Tensor& t_far,
                                        const std::function<torch::Tensor(const torch::Tensor&)>& to_unit,
                                        const torch::Tensor& uniforms, int64_t step) const {
  const int64_t rays = origins.size(0);
  const auto options = origins.options().dtype(torch::kFloat32);
  const torch::Tensor g_near = lin_disp_distance(t_near).unsqueeze(1);
  const torch::Tensor g_far = lin_disp_distance(t_far).unsqueeze(1);
  // s -> t, and the midpoints and lengths of the intervals between edges [R, n + 1].
  auto intervals = [&](const torch::Tensor& edges, torch::Tensor* mid, torch::Tensor* deltas) {
    const torch::Tensor t = lin_disp_inverse(g_near + edges * (g_far - g_near));
    *mid = (t.slice(1, 0, -1) + t.slice(1, 1)) * 0.5f;
    *deltas = t.slice(1, 1) - t.slice(1, 0, -1);
  };
  auto points = [&](const torch::Tensor& mid) {  // [R, n] -> [R * n, 3]
    return (origins.unsqueeze(1) + mid.unsqueeze(2) * directions.unsqueeze(1)).reshape({-1, 3});
  };
  auto jitter = [&](int64_t draw) {
    return uniforms.defined() ? uniforms.slice(1, draw, draw + 1) : torch::Tensor();
  };
  const double a = anneal(step);
  auto annealed = [a](const torch::Tensor& w) { return a == 1.0 ? w : w.pow(a); };

  // Draw 0 is even; each next one follows the last proposal field's weights. The proposal fields
  // are evaluated on theirs; the last draw is the radiance field's.
  ProposalSamples out;
  const int64_t counts[3] = {options_.first_samples, options_.second_samples, options_.nerf_samples};
  torch::Tensor mid, deltas;
  for (size_t draw = 0; draw <= fields_.size(); ++draw) {
    const torch::Tensor edges =
        draw == 0 ? uniform_edges(rays, counts[0], jitter(0), options)
                  : pdf_edges(out.edges.back(), annealed(out.weights.back().detach()), counts[draw],
                              jitter(static_cast<int64_t>(draw)));
    intervals(edges, &mid, &deltas);
    if (draw == fields_.size()) {
      out.nerf_edges = edges;
      break;
    }
    const torch::Tensor sigma = density(fields_[draw], to_unit(points(mid))).reshape({rays, -1});
    out.edges.push_back(edges);
    out.weights.push_back(composite_weights(sigma, deltas));
  }
  const int64_t n = options_.nerf_samples;
  const auto index_options = options.dtype(torch::kInt64);
  out.samples.ray_offsets = torch::arange(rays + 1, index_options) * n;
  out.samples.ts = mid.reshape({-1}).contiguous();
  out.samples.deltas = deltas.reshape({-1}).contiguous();
  out.samples.positions = points(mid).contiguous();
  out.samples.ray_indices = torch::arange(rays, index_options).repeat_interleave(n);
  return out;
}

torch::Tensor ProposalSampler::interlevel_loss(const ProposalSamples& samples,
                                               const torch::Tensor& nerf_weights) const {
  const torch::Tensor& c = samples.nerf_edges;  // [R, N + 1]
  const int64_t rays = c.size(0), n = c.size(1) - 1;
  const torch::Tensor w = nerf_weights.detach().reshape({rays, n});
  const torch::Tensor starts = c.slice(1, 0, -1).contiguous(), ends = c.slice(1, 1).contiguous();
  torch::Tensor loss = torch::zeros({rays}, w.options());
  for (size_t level = 0; level < samples.edges.size(); ++level) {
    const torch::Tensor& cp = samples.edges[level];
    const torch::Tensor& wp = samples.weights[level];
    const int64_t k = wp.size(1);
    // The proposal's weight on every interval that overlaps each radiance-field interval: a
    // difference of its cumulative weights.
    const torch::Tensor cum = torch::cat({torch::zeros({rays, 1}, wp.options()), torch::cumsum(wp, 1)}, 1);
    const torch::Tensor lo =
        (torch::searchsorted(cp.slice(1, 0, -1).contiguous(), starts, false, true) - 1).clamp(0, k - 1);
    const torch::Tensor hi = torch::searchsorted(cp.slice(1, 1).contiguous(), ends, false, true).clamp(0, k - 1);
    const torch::Tensor outer = cum.slice(1, 1).gather(1, hi) - cum.slice(1, 0, -1).gather(1, lo);
    loss = loss + ((w - outer).clamp_min(0.0f).square() / (w + kInterlevelEps)).mean(1);
  }
  return loss;
}

}  // namespace tessera::models::nerf
