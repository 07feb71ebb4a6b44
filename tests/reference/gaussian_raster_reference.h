// The naive plain-LibTorch Gaussian rasterizer that tests/test_gaussian_rasterize.cpp checks the
// tile binning + rasterization ops against, and tests/bench/bench_gaussian_rasterize.cpp times.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace tessera::test {

struct ReferenceRaster {
  torch::Tensor colors;    // [H, W, C]
  torch::Tensor alphas;    // [H, W]
  torch::Tensor last_ids;  // [H, W] int32: 1 + the tile-list position of the last Gaussian added
};

// Dense [pixels x Gaussians] compositing with the rules of kernels/gaussian_rasterize.h and
// kernels/tile_binning.h written out again with tensor ops (nothing shared with the kernels):
// Gaussians in global depth order (stable sort, ties by id); Gaussian g may affect pixel p only
// when g's tile rect (getRect rule, in float64) covers p's tile, radii[g] > 0 and p's tile is
// in tile_mask; sigma < 0 and alpha < 1/255 are skipped, alpha is capped at 0.99, and the pixel
// stops before the Gaussian whose inclusion would take its transmittance below 1e-4. All masks
// are computed without gradient; colors and alphas are differentiable with respect to means2d,
// conics, colors, opacities and background through autograd. Memory is O(H W N): small images.
inline ReferenceRaster reference_rasterize(
    const torch::Tensor& means2d,     // [N, 2]
    const torch::Tensor& conics,      // [N, 3]
    const torch::Tensor& colors,      // [N, C]
    const torch::Tensor& opacities,   // [N]
    const torch::Tensor& background,  // [C] or undefined
    const torch::Tensor& radii,       // [N] int32
    const torch::Tensor& depths,      // [N]
    int64_t width, int64_t height, int64_t tile_size,
    const torch::Tensor& tile_mask = {}) {  // [T] bool or undefined
  // Every tensor on means2d's device, so the CUDA tests run the reference where the kernel runs.
  const auto opts = means2d.options();
  const auto f64 = opts.dtype(torch::kFloat64);
  const auto i64 = opts.dtype(torch::kInt64);
  const int64_t n = means2d.size(0), channels = colors.size(1);
  const int64_t tiles_x = (width + tile_size - 1) / tile_size;
  const int64_t tiles_y = (height + tile_size - 1) / tile_size;
  const torch::Tensor bg =
      background.defined() ? background : torch::zeros({channels}, opts);

  // Depth order, ties by id (+0.0 makes -0 equal +0).
  const torch::Tensor order = std::get<1>(
      torch::sort(depths.detach() + 0.0, /*stable=*/std::optional<bool>(true), /*dim=*/0));
  const torch::Tensor m = means2d.index_select(0, order);
  const torch::Tensor con = conics.index_select(0, order);
  const torch::Tensor col = colors.index_select(0, order);
  const torch::Tensor op = opacities.index_select(0, order);
  const torch::Tensor r = radii.index_select(0, order).to(f64);

  // Tile rects [x0, x1) x [y0, y1) in float64.
  const torch::Tensor mx = m.detach().select(1, 0).to(f64), my = m.detach().select(1, 1).to(f64);
  const double ts = static_cast<double>(tile_size);
  const auto bound = [&](const torch::Tensor& v, int64_t hi) {
    return torch::floor(v / ts).clamp(0.0, static_cast<double>(hi)).to(torch::kInt64);
  };
  const torch::Tensor x0 = bound(mx - r, tiles_x), x1 = bound(mx + r + ts - 1.0, tiles_x);
  const torch::Tensor y0 = bound(my - r, tiles_y), y1 = bound(my + r + ts - 1.0, tiles_y);

  // Pixels, row-major, with their tiles.
  const torch::Tensor rows = torch::arange(height, i64).repeat_interleave(width);
  const torch::Tensor cols = torch::arange(width, i64).repeat({height});
  const torch::Tensor tx = (cols / tile_size).floor().to(torch::kInt64).unsqueeze(1);  // [P, 1]
  const torch::Tensor ty = (rows / tile_size).floor().to(torch::kInt64).unsqueeze(1);
  torch::Tensor member = (x0.unsqueeze(0) <= tx) & (tx < x1.unsqueeze(0)) &
                         (y0.unsqueeze(0) <= ty) & (ty < y1.unsqueeze(0)) &
                         (r > 0).unsqueeze(0);  // [P, N]
  if (tile_mask.defined())
    member = member & tile_mask.index_select(0, (ty * tiles_x + tx).squeeze(1)).unsqueeze(1);

  const torch::Tensor px = (cols.to(opts.dtype()) + 0.5).unsqueeze(1);  // [P, 1]
  const torch::Tensor py = (rows.to(opts.dtype()) + 0.5).unsqueeze(1);
  const torch::Tensor dx = m.select(1, 0).unsqueeze(0) - px;  // [P, N]
  const torch::Tensor dy = m.select(1, 1).unsqueeze(0) - py;
  const torch::Tensor sigma = 0.5 * (con.select(1, 0) * dx * dx + con.select(1, 2) * dy * dy) +
                              con.select(1, 1) * dx * dy;
  const torch::Tensor nonneg = sigma.detach() >= 0;
  // exp only of sigma >= 0 (the rest is skipped; keeps exp and its gradient finite).
  const torch::Tensor gauss = torch::exp(-torch::where(nonneg, sigma, torch::zeros_like(sigma)));
  const torch::Tensor raw = op.unsqueeze(0) * gauss;
  const torch::Tensor alpha =
      torch::where(raw.detach() > 0.99, torch::full_like(raw, 0.99), raw);
  const torch::Tensor valid = member & nonneg & (alpha.detach() >= 1.0 / 255.0);

  // Stop rule: entry k is added iff it is valid and the transmittance after it, T_k (1 - alpha),
  // is >= 1e-4 (T only decreases, so every later entry is cut too).
  const torch::Tensor after =
      torch::cumprod(1 - alpha.detach() * valid.to(opts.dtype()), 1);
  const torch::Tensor active = valid & (after >= 1e-4);
  const torch::Tensor factor = 1 - alpha * active.to(opts.dtype());
  const torch::Tensor before = torch::cat(
      {torch::ones({height * width, 1}, opts), torch::cumprod(factor, 1).slice(1, 0, n - 1)}, 1);
  const torch::Tensor w = before * alpha * active.to(opts.dtype());  // [P, N]
  const torch::Tensor t_final = n > 0 ? torch::prod(factor, 1) : torch::ones({height * width}, opts);

  ReferenceRaster out;
  out.colors = (torch::matmul(w, col) + t_final.unsqueeze(1) * bg.unsqueeze(0))
                   .view({height, width, channels});
  out.alphas = (1 - t_final).view({height, width});
  // Tile-list position: members of the pixel's tile counted in depth order.
  const torch::Tensor position = torch::cumsum(member.to(torch::kInt64), 1);
  out.last_ids = n > 0 ? (position * active.to(torch::kInt64)).amax(1).to(torch::kInt32)
                             .view({height, width})
                       : torch::zeros({height, width}, opts.dtype(torch::kInt32));
  return out;
}

}  // namespace tessera::test
