// CPU rasterize_gaussians_fwd / _bwd: tiles in parallel (at::parallel_for), each gathering its
// Gaussians once; backward recomputes per-pixel state back to front and reduces without atomics.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/gaussian_raster_math.h"
#include "kernels/gaussian_rasterize.h"
#include "kernels/tensor_args.h"

namespace tessera::kernels::cpu {

namespace {

// Gaussians per task of the per-Gaussian reduction in backward (a few adds each).
constexpr int64_t kGaussiansPerTask = 2048;

// Tiles cost very different amounts (empty sky vs. a dense object), and at::parallel_for hands
// each thread one contiguous block of the range. Visiting tiles in the order k -> k * stride mod T
// (stride coprime to T, about T / golden ratio) spreads every block over the whole image, so the
// blocks cost about the same. Results do not depend on the order: each tile is independent.
class TileOrder {
 public:
  explicit TileOrder(int64_t num_tiles) : num_tiles_(num_tiles) {
    stride_ = std::max<int64_t>(1, static_cast<int64_t>(0.6180339887 * num_tiles)) | 1;
    while (num_tiles > 1 && std::gcd(stride_, num_tiles) != 1) stride_ += 2;
  }
  int64_t operator()(int64_t k) const {
    return num_tiles_ <= 1 ? k : static_cast<int64_t>((static_cast<unsigned __int128>(k) *
                                                       stride_) % num_tiles_);
  }

 private:
  int64_t num_tiles_ = 0, stride_ = 1;
};

// Checks the offsets end to end on the host: 0, non-decreasing, M.
void check_offsets(const int64_t* offsets, int64_t num_tiles, int64_t num_isects) {
  TORCH_CHECK(offsets[0] == 0 && offsets[num_tiles] == num_isects,
              "rasterize_gaussians: tile_offsets must start at 0 and end at M = ", num_isects,
              "; got ", offsets[0], " and ", offsets[num_tiles]);
  for (int64_t t = 0; t < num_tiles; ++t)
    TORCH_CHECK(offsets[t] <= offsets[t + 1],
                "rasterize_gaussians: tile_offsets must be non-decreasing; tile ", t, " owns [",
                offsets[t], ", ", offsets[t + 1], ")");
}

// The attributes of one tile's Gaussians, gathered contiguously in list order.
template <typename scalar_t>
struct TileGaussians {
  std::vector<scalar_t> mx, my, a, b, c, opacity, color;  // color: [n, C]

  void gather(const scalar_t* means, const scalar_t* conics, const scalar_t* colors,
              const scalar_t* opacities, const int64_t* ids, int64_t first, int64_t last,
              int64_t num_gaussians, int64_t channels) {
    const int64_t n = last - first;
    for (auto* v : {&mx, &my, &a, &b, &c, &opacity}) v->resize(n);
    color.resize(n * channels);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t g = ids[first + k];
      TORCH_CHECK(0 <= g && g < num_gaussians, "rasterize_gaussians: gaussian_ids[",
                  first + k, "] = ", g, " is not in [0, N = ", num_gaussians, ")");
      mx[k] = means[2 * g];
      my[k] = means[2 * g + 1];
      a[k] = conics[3 * g];
      b[k] = conics[3 * g + 1];
      c[k] = conics[3 * g + 2];
      opacity[k] = opacities[g];
      std::copy(colors + g * channels, colors + (g + 1) * channels, color.begin() + k * channels);
    }
  }

  raster::PixelAlpha<scalar_t> alpha_at(int64_t k, scalar_t px, scalar_t py) const {
    return raster::pixel_alpha<scalar_t>(mx[k], my[k], a[k], b[k], c[k], opacity[k], px, py);
  }
};

// The image geometry in tiles.
struct Grid {
  int64_t width, height, tile_size, tiles_x, tiles_y;
  int64_t num_tiles() const { return tiles_x * tiles_y; }
};

template <typename scalar_t>
void forward(const scalar_t* means, const scalar_t* conics, const scalar_t* colors,
             const scalar_t* opacities, const scalar_t* background,  // [C] or null
             const int64_t* offsets, const int64_t* ids, int64_t num_gaussians, int64_t channels,
             const Grid& grid, scalar_t* out_colors, scalar_t* out_alphas, int32_t* out_last,
             scalar_t* out_transmittance) {
  const TileOrder order(grid.num_tiles());
  const scalar_t stop = static_cast<scalar_t>(raster::kTransmittanceStop);
  at::parallel_for(0, grid.num_tiles(), 1, [&](int64_t begin, int64_t end) {
    TileGaussians<scalar_t> tg;
    std::vector<scalar_t> acc(channels);
    for (int64_t k_tile = begin; k_tile < end; ++k_tile) {
      const int64_t tile = order(k_tile);
      const int64_t ty = tile / grid.tiles_x, tx = tile % grid.tiles_x;
      const int64_t first = offsets[tile];
      tg.gather(means, conics, colors, opacities, ids, first, offsets[tile + 1], num_gaussians,
                channels);
      const int64_t n = offsets[tile + 1] - first;
      const int64_t i_end = std::min(grid.height, (ty + 1) * grid.tile_size);
      const int64_t j_end = std::min(grid.width, (tx + 1) * grid.tile_size);
      for (int64_t i = ty * grid.tile_size; i < i_end; ++i) {
        for (int64_t j = tx * grid.tile_size; j < j_end; ++j) {
          const scalar_t px = static_cast<scalar_t>(j) + scalar_t(0.5);
          const scalar_t py = static_cast<scalar_t>(i) + scalar_t(0.5);
          std::fill(acc.begin(), acc.end(), scalar_t(0));
          scalar_t transmittance = 1;
          int32_t last = 0;
          for (int64_t k = 0; k < n; ++k) {
            const raster::PixelAlpha<scalar_t> p = tg.alpha_at(k, px, py);
            if (p.skip) continue;
            const scalar_t next = transmittance * (1 - p.alpha);
            if (next < stop) break;
            const scalar_t w = transmittance * p.alpha;
            const scalar_t* col = tg.color.data() + k * channels;
            for (int64_t ch = 0; ch < channels; ++ch) acc[ch] += w * col[ch];
            transmittance = next;
            last = static_cast<int32_t>(k + 1);
          }
          const int64_t pix = i * grid.width + j;
          for (int64_t ch = 0; ch < channels; ++ch)
            out_colors[pix * channels + ch] =
                acc[ch] + transmittance * (background ? background[ch] : scalar_t(0));
          out_alphas[pix] = 1 - transmittance;
          out_last[pix] = last;
          out_transmittance[pix] = transmittance;
        }
      }
    }
  });
}

// Per pixel, back to front over the entries k < last_ids, with T_final saved and S the colour
// composited behind entry k (normalized by the transmittance right after k):
//   T_k = T_{k+1} / (1 - alpha_k),   dL/dcolor_k += T_k alpha_k v_C,
//   dL/dalpha_k = T_k (v_C . color_k - v_C . S) + (v_A - v_C . background) T_final / (1 - alpha_k),
//   S <- alpha_k color_k + (1 - alpha_k) S.
// Entry e's gradients go to row e of the per-entry buffers (e is owned by one tile, so by one
// thread); entry_grads holds (mx, my, a, b, c, opacity) per entry, entry_colors C values.
template <typename scalar_t>
void backward_tiles(const scalar_t* means, const scalar_t* conics, const scalar_t* colors,
                    const scalar_t* opacities, const scalar_t* background,  // [C] or null
                    const int64_t* offsets, const int64_t* ids, int64_t num_gaussians,
                    int64_t channels, const Grid& grid, const int32_t* last_ids,
                    const scalar_t* transmittance, const scalar_t* v_colors,  // or null
                    const scalar_t* v_alphas,                                 // or null
                    scalar_t* entry_grads,                                    // [M, 6]
                    scalar_t* entry_colors,                                   // [M, C]
                    scalar_t* tile_background) {                              // [T, C]
  const TileOrder order(grid.num_tiles());
  at::parallel_for(0, grid.num_tiles(), 1, [&](int64_t begin, int64_t end) {
    TileGaussians<scalar_t> tg;
    std::vector<scalar_t> v_c(channels), s(channels);
    for (int64_t k_tile = begin; k_tile < end; ++k_tile) {
      const int64_t tile = order(k_tile);
      const int64_t ty = tile / grid.tiles_x, tx = tile % grid.tiles_x;
      const int64_t first = offsets[tile];
      const int64_t n = offsets[tile + 1] - first;
      tg.gather(means, conics, colors, opacities, ids, first, offsets[tile + 1], num_gaussians,
                channels);
      scalar_t* eg = entry_grads + first * 6;
      scalar_t* ec = entry_colors + first * channels;
      scalar_t* tb = tile_background + tile * channels;
      const int64_t i_end = std::min(grid.height, (ty + 1) * grid.tile_size);
      const int64_t j_end = std::min(grid.width, (tx + 1) * grid.tile_size);
      for (int64_t i = ty * grid.tile_size; i < i_end; ++i) {
        for (int64_t j = tx * grid.tile_size; j < j_end; ++j) {
          const int64_t pix = i * grid.width + j;
          const int32_t last = last_ids[pix];
          TORCH_CHECK(0 <= last && last <= n, "rasterize_gaussians_bwd: last_ids[", i, ", ", j,
                      "] = ", last, " does not fit its tile's ", n, " entries");
          const scalar_t t_final = transmittance[pix];
          bool any = false;
          for (int64_t ch = 0; ch < channels; ++ch) {
            v_c[ch] = v_colors ? v_colors[pix * channels + ch] : scalar_t(0);
            any = any || v_c[ch] != scalar_t(0);
          }
          const scalar_t v_a = v_alphas ? v_alphas[pix] : scalar_t(0);
          if (!any && v_a == scalar_t(0)) continue;
          scalar_t bg_dot = 0;
          if (background)
            for (int64_t ch = 0; ch < channels; ++ch) {
              tb[ch] += t_final * v_c[ch];
              bg_dot += v_c[ch] * background[ch];
            }
          const scalar_t px = static_cast<scalar_t>(j) + scalar_t(0.5);
          const scalar_t py = static_cast<scalar_t>(i) + scalar_t(0.5);
          std::fill(s.begin(), s.end(), scalar_t(0));
          scalar_t t = t_final;
          for (int64_t k = last - 1; k >= 0; --k) {
            const raster::PixelAlpha<scalar_t> p = tg.alpha_at(k, px, py);
            if (p.skip) continue;
            const scalar_t one_minus = 1 - p.alpha;
            t = t / one_minus;  // now T_k, before entry k
            const scalar_t w = t * p.alpha;
            const scalar_t* col = tg.color.data() + k * channels;
            scalar_t dot_color = 0, dot_behind = 0;
            for (int64_t ch = 0; ch < channels; ++ch) {
              dot_color += v_c[ch] * col[ch];
              dot_behind += v_c[ch] * s[ch];
              ec[k * channels + ch] += w * v_c[ch];
              s[ch] = p.alpha * col[ch] + one_minus * s[ch];
            }
            const scalar_t v_alpha =
                t * (dot_color - dot_behind) + (v_a - bg_dot) * t_final / one_minus;
            const raster::PairGrads<scalar_t> g =
                raster::pair_grads<scalar_t>(p, tg.a[k], tg.b[k], tg.c[k], tg.opacity[k], v_alpha);
            scalar_t* e = eg + k * 6;
            e[0] += g.v_mx;
            e[1] += g.v_my;
            e[2] += g.v_a;
            e[3] += g.v_b;
            e[4] += g.v_c;
            e[5] += g.v_opacity;
          }
        }
      }
    }
  });
}

// Sums each Gaussian's entries in increasing entry order: entries grouped by id with a stable
// counting sort (sequential, O(M + N)), then Gaussians in parallel. Bitwise independent of the
// thread count.
template <typename scalar_t>
void reduce_entries(const int64_t* ids, int64_t num_isects, int64_t num_gaussians,
                    int64_t channels, const scalar_t* entry_grads, const scalar_t* entry_colors,
                    scalar_t* v_means, scalar_t* v_conics, scalar_t* v_colors,
                    scalar_t* v_opacities) {
  std::vector<int64_t> start(num_gaussians + 1, 0);
  for (int64_t e = 0; e < num_isects; ++e) ++start[ids[e] + 1];
  for (int64_t g = 0; g < num_gaussians; ++g) start[g + 1] += start[g];
  std::vector<int64_t> grouped(num_isects);
  {
    std::vector<int64_t> cursor(start.begin(), start.end() - 1);
    for (int64_t e = 0; e < num_isects; ++e) grouped[cursor[ids[e]]++] = e;
  }
  at::parallel_for(0, num_gaussians, kGaussiansPerTask, [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> col(channels);
    for (int64_t g = begin; g < end; ++g) {
      scalar_t sum[6] = {0, 0, 0, 0, 0, 0};
      std::fill(col.begin(), col.end(), scalar_t(0));
      for (int64_t q = start[g]; q < start[g + 1]; ++q) {
        const int64_t e = grouped[q];
        for (int v = 0; v < 6; ++v) sum[v] += entry_grads[e * 6 + v];
        for (int64_t ch = 0; ch < channels; ++ch) col[ch] += entry_colors[e * channels + ch];
      }
      v_means[2 * g] = sum[0];
      v_means[2 * g + 1] = sum[1];
      v_conics[3 * g] = sum[2];
      v_conics[3 * g + 1] = sum[3];
      v_conics[3 * g + 2] = sum[4];
      v_opacities[g] = sum[5];
      for (int64_t ch = 0; ch < channels; ++ch) v_colors[g * channels + ch] = col[ch];
    }
  });
}

Grid grid_of(int64_t width, int64_t height, int64_t tile_size) {
  return {width, height, tile_size, tiles_along(width, tile_size),
          tiles_along(height, tile_size)};
}

}  // namespace

RasterizeOutput rasterize_gaussians_fwd(const torch::Tensor& means2d, const torch::Tensor& conics,
                                        const torch::Tensor& colors,
                                        const torch::Tensor& opacities,
                                        const torch::Tensor& background,
                                        const torch::Tensor& tile_offsets,
                                        const torch::Tensor& gaussian_ids, int64_t width,
                                        int64_t height, int64_t tile_size) {
  const torch::Tensor m = means2d.contiguous(), con = conics.contiguous(),
                      col = colors.contiguous(), op = opacities.contiguous(),
                      bg = contiguous_or_undefined(background), off = tile_offsets.contiguous(),
                      ids = gaussian_ids.contiguous();
  const Grid grid = grid_of(width, height, tile_size);
  const int64_t channels = col.size(1);
  const auto options = m.options();
  RasterizeOutput out;
  out.colors = torch::empty({height, width, channels}, options);
  out.alphas = torch::empty({height, width}, options);
  out.last_ids = torch::empty({height, width}, options.dtype(torch::kInt32));
  out.transmittance = torch::empty({height, width}, options);
  check_offsets(off.data_ptr<int64_t>(), grid.num_tiles(), ids.size(0));
  if (width == 0 || height == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "rasterize_gaussians_fwd_cpu", [&] {
    forward<scalar_t>(m.data_ptr<scalar_t>(), con.data_ptr<scalar_t>(), col.data_ptr<scalar_t>(),
                      op.data_ptr<scalar_t>(), optional_ptr<scalar_t>(bg),
                      off.data_ptr<int64_t>(), ids.data_ptr<int64_t>(), m.size(0), channels,
                      grid, out.colors.data_ptr<scalar_t>(), out.alphas.data_ptr<scalar_t>(),
                      out.last_ids.data_ptr<int32_t>(), out.transmittance.data_ptr<scalar_t>());
  });
  return out;
}

RasterizeGrads rasterize_gaussians_bwd(
    const torch::Tensor& means2d, const torch::Tensor& conics, const torch::Tensor& colors,
    const torch::Tensor& opacities, const torch::Tensor& background,
    const torch::Tensor& tile_offsets, const torch::Tensor& gaussian_ids, int64_t width,
    int64_t height, int64_t tile_size, const torch::Tensor& last_ids,
    const torch::Tensor& transmittance, const torch::Tensor& v_colors,
    const torch::Tensor& v_alphas) {
  const torch::Tensor m = means2d.contiguous(), con = conics.contiguous(),
                      col = colors.contiguous(), op = opacities.contiguous(),
                      bg = contiguous_or_undefined(background), off = tile_offsets.contiguous(),
                      ids = gaussian_ids.contiguous(), last = last_ids.contiguous(),
                      trans = transmittance.contiguous(),
                      g_colors = contiguous_or_undefined(v_colors),
                      g_alphas = contiguous_or_undefined(v_alphas);
  const Grid grid = grid_of(width, height, tile_size);
  const int64_t n = m.size(0), channels = col.size(1), num_isects = ids.size(0);
  const auto options = m.options();
  RasterizeGrads grads;
  grads.v_means2d = torch::empty({n, 2}, options);
  grads.v_conics = torch::empty({n, 3}, options);
  grads.v_colors = torch::empty({n, channels}, options);
  grads.v_opacities = torch::empty({n}, options);
  check_offsets(off.data_ptr<int64_t>(), grid.num_tiles(), num_isects);
  const torch::Tensor entry_grads = torch::zeros({num_isects, 6}, options);
  const torch::Tensor entry_colors = torch::zeros({num_isects, channels}, options);
  const torch::Tensor tile_background = torch::zeros({grid.num_tiles(), channels}, options);
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "rasterize_gaussians_bwd_cpu", [&] {
    if (width > 0 && height > 0)
      backward_tiles<scalar_t>(
          m.data_ptr<scalar_t>(), con.data_ptr<scalar_t>(), col.data_ptr<scalar_t>(),
          op.data_ptr<scalar_t>(), optional_ptr<scalar_t>(bg), off.data_ptr<int64_t>(),
          ids.data_ptr<int64_t>(), n, channels, grid, last.data_ptr<int32_t>(),
          trans.data_ptr<scalar_t>(), optional_ptr<scalar_t>(g_colors),
          optional_ptr<scalar_t>(g_alphas), entry_grads.data_ptr<scalar_t>(),
          entry_colors.data_ptr<scalar_t>(), tile_background.data_ptr<scalar_t>());
    reduce_entries<scalar_t>(ids.data_ptr<int64_t>(), num_isects, n, channels,
                             entry_grads.data_ptr<scalar_t>(), entry_colors.data_ptr<scalar_t>(),
                             grads.v_means2d.data_ptr<scalar_t>(),
                             grads.v_conics.data_ptr<scalar_t>(),
                             grads.v_colors.data_ptr<scalar_t>(),
                             grads.v_opacities.data_ptr<scalar_t>());
    if (bg.defined()) {
      // Tiles summed in tile order: fixed, whatever the threads.
      grads.v_background = torch::zeros({channels}, options);
      scalar_t* v_bg = grads.v_background.data_ptr<scalar_t>();
      const scalar_t* tb = tile_background.data_ptr<scalar_t>();
      for (int64_t t = 0; t < grid.num_tiles(); ++t)
        for (int64_t ch = 0; ch < channels; ++ch) v_bg[ch] += tb[t * channels + ch];
    }
  });
  return grads;
}

}  // namespace tessera::kernels::cpu
