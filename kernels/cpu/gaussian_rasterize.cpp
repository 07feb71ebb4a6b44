// CPU rasterize_gaussians_fwd / _bwd: tiles in parallel (at::parallel_for). Each tile gathers the
// Gaussians of its list that can reach one of its pixels, chunk by chunk for as long as a pixel
// is still live, and renders its pixels in row segments
// of kLanes pixels that walk the list together: the per-pair math runs across the lanes (the
// compiler vectorizes it; on x86-64 an AVX2 copy is chosen at run time), a segment passes over a
// Gaussian that none of its pixels can see without computing any exp, and float32's exp is a
// branch-free polynomial. Backward recomputes the per-pixel state back to front and reduces
// without atomics. Results are bitwise independent of the thread count.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_build.h"
#include "kernels/cpu/parallel.h"
#include "kernels/gaussian_raster_math.h"
#include "kernels/gaussian_rasterize.h"
#include "kernels/tensor_args.h"

// The hot loops are compiled twice, for AVX2 and the baseline ISA (TESSERA_AVX2_CLONES).

// The lane vectors never cross a call boundary (every helper taking or returning one is inlined),
// so the ABI note about passing them without AVX enabled does not apply.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace tessera::kernels::cpu {

namespace {

// Gaussians per task of the per-Gaussian reduction in backward (a few adds each).
constexpr int64_t kGaussiansPerTask = 2048;
// Pixels of a row segment that walk a tile's list together (one AVX2 register of floats).
constexpr int kLanes = 8;

// The lanes of a segment as GCC/Clang vector types: V holds one value per lane, M a mask (all
// bits set in a lane where true), of the same element width so that `mask ? v : w` selects.
template <typename scalar_t>
struct Lanes;
template <>
struct Lanes<float> {
  typedef float V __attribute__((vector_size(kLanes * sizeof(float))));
  typedef int32_t M __attribute__((vector_size(kLanes * sizeof(int32_t))));
};
template <>
struct Lanes<double> {
  typedef double V __attribute__((vector_size(kLanes * sizeof(double))));
  typedef int64_t M __attribute__((vector_size(kLanes * sizeof(int64_t))));
};

template <typename V, typename S>
inline __attribute__((always_inline)) V splat(S value) {
  return V{} + static_cast<decltype(V{}[0])>(value);
}

template <typename M>
inline __attribute__((always_inline)) bool any_of(M mask) {
  uint64_t words[sizeof(M) / sizeof(uint64_t)];
  std::memcpy(words, &mask, sizeof(M));
  uint64_t all = 0;
  for (uint64_t w : words) all |= w;
  return all != 0;
}

// exp(x) across float lanes without calls or branches: Cephes' expf (range reduction by ln 2 in
// two parts, a degree-6 polynomial; relative error < 2e-7), x clamped to [-87.3, 88] so that the
// result's exponent stays normal. A NaN x gives some finite value; the rasterizer skips NaN
// sigmas without looking at it.
inline __attribute__((always_inline)) Lanes<float>::V lane_exp(Lanes<float>::V x) {
  using V = Lanes<float>::V;
  using M = Lanes<float>::M;
  const V lo = splat<V>(-87.3365447504f), hi = splat<V>(88.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  x = x == x ? x : lo;  // NaN
  const V magic = splat<V>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const V n = (x * 1.44269504088896341f + magic) - magic;
  const V r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  V p = splat<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const M bits = (__builtin_convertvector(n, M) + 127) << 23;  // 2^n
  return p * (V)bits;
}
// float64 (the exact path the tests compare with the reference): the library's exp per lane.
inline __attribute__((always_inline)) Lanes<double>::V lane_exp(Lanes<double>::V x) {
  for (int l = 0; l < kLanes; ++l) x[l] = std::exp(x[l]);
  return x;
}

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

// Checks on the host, before the tile loops (which throw nothing: an exception cannot cross the
// run-time dispatch of TESSERA_AVX2_CLONES): every id in [0, N), every last_ids within its
// tile's list.
void check_ids(const int64_t* ids, int64_t num_isects, int64_t num_gaussians) {
  for (int64_t e = 0; e < num_isects; ++e)
    TORCH_CHECK(0 <= ids[e] && ids[e] < num_gaussians, "rasterize_gaussians: gaussian_ids[", e,
                "] = ", ids[e], " is not in [0, N = ", num_gaussians, ")");
}

template <typename scalar_t>
struct Splat;

// The op's inputs as pointers, and the packed Gaussians (pack_splats).
template <typename scalar_t>
struct Inputs {
  const scalar_t* means;       // [N, 2]
  const scalar_t* conics;      // [N, 3]
  const scalar_t* colors;      // [N, C]
  const scalar_t* opacities;   // [N]
  const scalar_t* background;  // [C] or null
  const int64_t* offsets;      // [T + 1]
  const int64_t* ids;          // [M]
  int64_t num_gaussians, channels;
  const Splat<scalar_t>* splats = nullptr;
};

// The image geometry in tiles, and one tile's pixels.
struct Grid {
  int64_t width, height, tile_size, tiles_x, tiles_y;
  int64_t num_tiles() const { return tiles_x * tiles_y; }
};

struct TileBox {
  int64_t i0, i1, j0, j1;  // rows [i0, i1), columns [j0, j1)
};

TileBox box_of(const Grid& grid, int64_t tile) {
  const int64_t ty = tile / grid.tiles_x, tx = tile % grid.tiles_x;
  return {ty * grid.tile_size, std::min(grid.height, (ty + 1) * grid.tile_size),
          tx * grid.tile_size, std::min(grid.width, (tx + 1) * grid.tile_size)};
}

// One Gaussian's attributes packed for the tiles' gathers (one cache line instead of four
// arrays), with its cut = raster::skip_sigma(opacity) and the half-extents (ex, ey) of the ellipse
// sigma <= cut: a tile whose pixel centres all lie outside that box cannot see the Gaussian (a
// tile rect is the Gaussian's 3-sigma square, which for a faint Gaussian reaches far past what it
// can draw). For a positive-definite conic C the extents are sqrt(2 cut S_xx), sqrt(2 cut S_yy),
// S = C^-1, widened by 0.01% + 1e-3 px for rounding; +inf (never culled) for an indefinite or
// degenerate conic and non-finite values; a negative cut (opacity under kMinAlpha) culls always.
template <typename scalar_t>
struct Splat {
  scalar_t mx, my, a, b, c, opacity, cut, ex, ey;

  bool misses(const TileBox& box) const {
    if (cut < 0) return true;  // every pixel: sigma < 0 is skipped, sigma >= 0 exceeds the cut
    return mx + ex < static_cast<scalar_t>(box.j0) + scalar_t(0.5) ||
           mx - ex > static_cast<scalar_t>(box.j1) - scalar_t(0.5) ||
           my + ey < static_cast<scalar_t>(box.i0) + scalar_t(0.5) ||
           my - ey > static_cast<scalar_t>(box.i1) - scalar_t(0.5);
  }
};

template <typename scalar_t>
std::vector<Splat<scalar_t>> pack_splats(const Inputs<scalar_t>& in) {
  std::vector<Splat<scalar_t>> out(in.num_gaussians);
  tessera::parallel_for(0, in.num_gaussians, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const scalar_t* con = in.conics + 3 * g;
      const double a = con[0], b = con[1], c = con[2];
      const double cut = raster::skip_sigma(static_cast<double>(in.opacities[g]));
      const double det = a * c - b * b;
      double ex = HUGE_VAL, ey = HUGE_VAL;
      if (std::isfinite(cut) && cut >= 0 && a > 0 && det > 0 && std::isfinite(det)) {
        ex = std::sqrt(2 * cut * c / det) * (1 + 1e-4) + 1e-3;
        ey = std::sqrt(2 * cut * a / det) * (1 + 1e-4) + 1e-3;
      }
      out[g] = {in.means[2 * g], in.means[2 * g + 1], con[0], con[1], con[2], in.opacities[g],
                static_cast<scalar_t>(cut), static_cast<scalar_t>(ex), static_cast<scalar_t>(ey)};
    }
  });
  return out;
}

// The attributes of one tile's Gaussians that can reach its pixels, gathered contiguously in list
// order; entry[k] is the position of kept Gaussian k in the tile's list (what last_ids counts).
template <typename scalar_t>
struct TileGaussians {
  std::vector<scalar_t> mx, my, a, b, c, opacity, cut, color;  // color: [n, C]
  std::vector<int64_t> entry;
  int64_t n = 0;

  int64_t size() const { return n; }

  // Positions [begin, end) of the tile's list.
  void gather(const Inputs<scalar_t>& in, int64_t tile, const TileBox& box, int64_t begin,
              int64_t end) {
    const int64_t first = in.offsets[tile];
    const int64_t count = end - begin;
    const int64_t channels = in.channels;
    for (auto* v : {&mx, &my, &a, &b, &c, &opacity, &cut})
      if (static_cast<int64_t>(v->size()) < count) v->resize(count);
    if (static_cast<int64_t>(entry.size()) < count) entry.resize(count);
    if (static_cast<int64_t>(color.size()) < count * channels) color.resize(count * channels);
    n = 0;
    for (int64_t k = begin; k < end; ++k) {
      const int64_t g = in.ids[first + k];  // in [0, N): check_ids
      const Splat<scalar_t>& sp = in.splats[g];
      if (sp.misses(box)) continue;
      mx[n] = sp.mx;
      my[n] = sp.my;
      a[n] = sp.a;
      b[n] = sp.b;
      c[n] = sp.c;
      opacity[n] = sp.opacity;
      cut[n] = sp.cut;
      for (int64_t ch = 0; ch < channels; ++ch)
        color[n * channels + ch] = in.colors[g * channels + ch];
      entry[n] = k;
      ++n;
    }
  }
};

// n lane vectors, zeroed, on 64 bytes: the AVX2 clone loads them aligned to 32 while the
// baseline compilation unit (std::vector, alignof) takes a vector type's alignment as 16. Out of
// memory aborts: nothing may throw inside the cloned tile loops.
template <typename T>
class LaneArray {
 public:
  T* zeroed(int64_t n) {
    if (n > capacity_ || data_ == nullptr) {  // never memset a null pointer, even for n = 0
      const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T) + 63) / 64 * 64;
      data_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
      if (data_ == nullptr) std::abort();
      capacity_ = n;
    }
    std::memset(static_cast<void*>(data_.get()), 0, static_cast<size_t>(n) * sizeof(T));
    return data_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t capacity_ = 0;
};

// Per-thread scratch: in forward each row segment's state across the chunks of a tile's list
// (transmittance, colour sums, live lanes, last entries); in backward the lanes' cotangents and
// behind-colours (one V per channel) and each kept Gaussian's gradients per lane ([k][6 + C]:
// mx, my, a, b, c, opacity, then the colour), summed over the lanes once per tile, so that the
// lanes' loops carry no reduction and the order of the sums is fixed.
template <typename scalar_t>
struct LaneScratch {
  using V = typename Lanes<scalar_t>::V;
  using M = typename Lanes<scalar_t>::M;
  LaneArray<V> trans, acc, v_c, s, lane_grads;
  LaneArray<M> live, last;
};

template <typename V>
inline __attribute__((always_inline)) V lane_offsets() {
  V v{};
  for (int l = 0; l < kLanes; ++l) v[l] = static_cast<decltype(v[0] + 0)>(l);
  return v;
}

// sigma of raster::pair_sigma across the lanes: the pixels (px[l], py), dx = mx - px.
template <typename V, typename S>
inline __attribute__((always_inline)) V lane_sigma(S a, S b, S c, V dx, S dy) {
  return S(0.5) * (a * dx * dx + c * dy * dy) + b * dx * dy;
}

// Forward of one row segment, pixels (i, j0 + l) for the lanes l that are live, over the kept
// Gaussians of one chunk of the tile's list, front to back under the rule of
// kernels/gaussian_rasterize.h (raster::pixel_alpha across the lanes); a Gaussian whose sigma
// exceeds its cut at every live pixel is passed over. The state (transmittance, colour sums,
// live lanes, last entries) carries over to the next chunk.
template <typename scalar_t>
inline __attribute__((always_inline)) void forward_walk(
    const TileGaussians<scalar_t>& tg, int64_t channels, scalar_t py,
    typename Lanes<scalar_t>::V px, typename Lanes<scalar_t>::V& trans,
    typename Lanes<scalar_t>::M& live, typename Lanes<scalar_t>::M& last,
    typename Lanes<scalar_t>::V* acc) {
  using V = typename Lanes<scalar_t>::V;
  using M = typename Lanes<scalar_t>::M;
  const V zero = splat<V>(0), one = splat<V>(1);
  const V stop = splat<V>(raster::kTransmittanceStop);
  const V max_alpha = splat<V>(raster::kMaxAlpha), min_alpha = splat<V>(raster::kMinAlpha);
  const int64_t n = tg.size();
  for (int64_t k = 0; k < n; ++k) {
    const V sigma = lane_sigma(tg.a[k], tg.b[k], tg.c[k], tg.mx[k] - px, tg.my[k] - py);
    if (!any_of(live & (sigma <= tg.cut[k]))) continue;
    const V raw = tg.opacity[k] * lane_exp(-sigma);
    const V alpha = raw > max_alpha ? max_alpha : raw;
    // Not skipped: sigma >= 0 and alpha >= kMinAlpha (a NaN alpha is not skipped).
    const M ok = live & (sigma >= zero) & ~(alpha < min_alpha);
    const V next = trans * (one - alpha);
    const M stops = ok & (next < stop);
    const M add = ok & ~stops;
    live &= ~stops;
    const V w = trans * alpha;
    trans = add ? next : trans;
    last = add ? splat<M>(tg.entry[k] + 1) : last;
    const scalar_t* col = tg.color.data() + k * channels;
    for (int64_t ch = 0; ch < channels; ++ch) acc[ch] = add ? acc[ch] + w * col[ch] : acc[ch];
    if (!any_of(live)) return;
  }
}

// Per pixel, back to front over the entries k < last_ids, with T_final saved and S the colour
// composited behind entry k (normalized by the transmittance right after k):
//   T_k = T_{k+1} / (1 - alpha_k),   dL/dcolor_k += T_k alpha_k v_C,
//   dL/dalpha_k = T_k (v_C . color_k - v_C . S) + (v_A - v_C . background) T_final / (1 - alpha_k),
//   S <- alpha_k color_k + (1 - alpha_k) S.
// The segment's lanes walk together and add kept Gaussian k's gradients to its lane partials
// (scratch.lane_grads); tb is the tile's background gradient.
template <typename scalar_t>
inline __attribute__((always_inline)) void backward_segment(
    const TileGaussians<scalar_t>& tg, const Inputs<scalar_t>& in, const Grid& grid, int64_t i,
    int64_t j0, int lanes, const int32_t* last_ids, const scalar_t* transmittance,
    const scalar_t* v_colors, const scalar_t* v_alphas, LaneScratch<scalar_t>& scratch,
    typename Lanes<scalar_t>::V* lane_grads, scalar_t* tb) {
  using V = typename Lanes<scalar_t>::V;
  using M = typename Lanes<scalar_t>::M;
  const int64_t channels = in.channels;
  const V zero = splat<V>(0), one = splat<V>(1);
  const V max_alpha = splat<V>(raster::kMaxAlpha), min_alpha = splat<V>(raster::kMinAlpha);
  const scalar_t py = static_cast<scalar_t>(i) + scalar_t(0.5);
  const V px = lane_offsets<V>() + (static_cast<scalar_t>(j0) + scalar_t(0.5));
  V* v_c = scratch.v_c.zeroed(channels);
  V* s = scratch.s.zeroed(channels);
  V t_final = one, v_rest = zero;
  M last = splat<M>(0);
  int64_t top = 0;  // the segment walks the entries below max(last)
  for (int l = 0; l < lanes; ++l) {
    const int64_t pix = i * grid.width + j0 + l;
    bool any = false;
    for (int64_t ch = 0; ch < channels; ++ch) {
      const scalar_t v = v_colors ? v_colors[pix * channels + ch] : scalar_t(0);
      v_c[ch][l] = v;
      any = any || v != scalar_t(0);
    }
    const scalar_t v_a = v_alphas ? v_alphas[pix] : scalar_t(0);
    if (!any && v_a == scalar_t(0)) continue;  // the lane stays at last = 0
    t_final[l] = transmittance[pix];
    scalar_t bg_dot = 0;
    if (in.background)
      for (int64_t ch = 0; ch < channels; ++ch) {
        tb[ch] += t_final[l] * v_c[ch][l];
        bg_dot += v_c[ch][l] * in.background[ch];
      }
    v_rest[l] = v_a - bg_dot;
    last[l] = last_ids[pix];
    top = std::max<int64_t>(top, last_ids[pix]);
  }
  if (top == 0) return;
  V trans = t_final;
  // The kept Gaussians are in list order: start at the last one below `top`.
  int64_t k = std::lower_bound(tg.entry.begin(), tg.entry.begin() + tg.size(), top) - tg.entry.begin();
  while (k-- > 0) {
    const M active = splat<M>(tg.entry[k]) < last;
    const scalar_t mx = tg.mx[k], dy = tg.my[k] - py, a = tg.a[k], b = tg.b[k], c = tg.c[k];
    const scalar_t opacity = tg.opacity[k];
    const V dx = mx - px;
    const V sigma = lane_sigma(a, b, c, dx, dy);
    if (!any_of(active & (sigma <= tg.cut[k]))) continue;
    const V gauss = lane_exp(-sigma);
    const V raw = opacity * gauss;
    const M capped = raw > max_alpha;
    const V alpha = capped ? max_alpha : raw;
    const M ok = active & (sigma >= zero) & ~(alpha < min_alpha);
    const V om = one - alpha;
    trans = ok ? trans / om : trans;  // now T_k, before entry k
    const V w = trans * alpha;
    V v_alpha = v_rest * t_final / om;
    const scalar_t* col = tg.color.data() + k * channels;
    V* partial = lane_grads + k * (6 + channels);
    for (int64_t ch = 0; ch < channels; ++ch) {
      v_alpha += trans * v_c[ch] * (col[ch] - s[ch]);
      partial[6 + ch] += ok ? w * v_c[ch] : zero;
      s[ch] = ok ? alpha * col[ch] + om * s[ch] : s[ch];
    }
    // raster::pair_grads across the lanes: nothing through a capped alpha or a skipped entry.
    const M flows = ok & ~capped;
    const V v_sigma = flows ? -opacity * gauss * v_alpha : zero;
    partial[0] += (a * dx + b * dy) * v_sigma;
    partial[1] += (b * dx + c * dy) * v_sigma;
    partial[2] += scalar_t(0.5) * dx * dx * v_sigma;
    partial[3] += dx * dy * v_sigma;
    partial[4] += scalar_t(0.5) * dy * dy * v_sigma;
    partial[5] += flows ? gauss * v_alpha : zero;
  }
}

// Forward of one tile: its rows in segments of kLanes pixels walk the list in chunks of
// kChunk entries, each chunk gathered (culled) once, until every pixel has stopped; what the
// pixels never reach is never gathered (long lists whose pixels saturate early).
constexpr int64_t kChunk = 512;

template <typename scalar_t>
inline __attribute__((always_inline)) void forward_tile_impl(
    const Inputs<scalar_t>& in, const Grid& grid, int64_t tile, TileGaussians<scalar_t>& tg,
    LaneScratch<scalar_t>& scratch, scalar_t* out_colors, scalar_t* out_alphas,
    int32_t* out_last, scalar_t* out_transmittance) {
  using V = typename Lanes<scalar_t>::V;
  using M = typename Lanes<scalar_t>::M;
  const int64_t channels = in.channels;
  const TileBox box = box_of(grid, tile);
  const int64_t per_row = (box.j1 - box.j0 + kLanes - 1) / kLanes;
  const int64_t segments = (box.i1 - box.i0) * per_row;
  V* trans = scratch.trans.zeroed(segments);
  V* acc = scratch.acc.zeroed(segments * channels);
  M* live = scratch.live.zeroed(segments);
  M* last = scratch.last.zeroed(segments);
  const V offsets = lane_offsets<V>();
  for (int64_t q = 0; q < segments; ++q) {
    const int64_t j0 = box.j0 + (q % per_row) * kLanes;
    trans[q] = splat<V>(1);
    live[q] = offsets < splat<V>(std::min<int64_t>(kLanes, box.j1 - j0));
  }
  const int64_t list = in.offsets[tile + 1] - in.offsets[tile];
  bool any_live = segments > 0;
  for (int64_t begin = 0; begin < list && any_live; begin += kChunk) {
    tg.gather(in, tile, box, begin, std::min(list, begin + kChunk));
    any_live = false;
    for (int64_t q = 0; q < segments; ++q) {
      if (!any_of(live[q])) continue;
      const int64_t i = box.i0 + q / per_row, j0 = box.j0 + (q % per_row) * kLanes;
      const V px = offsets + (static_cast<scalar_t>(j0) + scalar_t(0.5));
      forward_walk(tg, channels, static_cast<scalar_t>(i) + scalar_t(0.5), px, trans[q], live[q],
                   last[q], acc + q * channels);
      any_live = any_live || any_of(live[q]);
    }
  }
  for (int64_t q = 0; q < segments; ++q) {
    const int64_t i = box.i0 + q / per_row, j0 = box.j0 + (q % per_row) * kLanes;
    const int lanes = static_cast<int>(std::min<int64_t>(kLanes, box.j1 - j0));
    for (int l = 0; l < lanes; ++l) {
      const int64_t pix = i * grid.width + j0 + l;
      for (int64_t ch = 0; ch < channels; ++ch)
        out_colors[pix * channels + ch] =
            acc[q * channels + ch][l] +
            trans[q][l] * (in.background ? in.background[ch] : scalar_t(0));
      out_alphas[pix] = 1 - trans[q][l];
      out_last[pix] = static_cast<int32_t>(last[q][l]);
      out_transmittance[pix] = trans[q][l];
    }
  }
}

// Backward of one tile: only the first `top` entries of its list (top = the largest last_ids of
// its pixels: no pixel reached further), whose gradients go to the rows [first, first + top) of
// the buffers.
template <typename scalar_t>
inline __attribute__((always_inline)) void backward_tile_impl(
    const Inputs<scalar_t>& in, const Grid& grid, int64_t tile, int64_t first, int64_t top,
    TileGaussians<scalar_t>& tg, LaneScratch<scalar_t>& scratch, const int32_t* last_ids,
    const scalar_t* transmittance, const scalar_t* v_colors, const scalar_t* v_alphas,
    scalar_t* entry_grads, scalar_t* entry_colors, scalar_t* tile_background) {
  using V = typename Lanes<scalar_t>::V;
  const TileBox box = box_of(grid, tile);
  tg.gather(in, tile, box, 0, top);
  const int64_t channels = in.channels, width = 6 + channels, n = tg.size();
  V* lane_grads = scratch.lane_grads.zeroed(n * width);
  for (int64_t i = box.i0; i < box.i1; ++i)
    for (int64_t j0 = box.j0; j0 < box.j1; j0 += kLanes)
      backward_segment(tg, in, grid, i, j0,
                       static_cast<int>(std::min<int64_t>(kLanes, box.j1 - j0)), last_ids,
                       transmittance, v_colors, v_alphas, scratch, lane_grads,
                       tile_background + tile * channels);
  // Row first + entry[k] is this tile's alone: it gets the lanes' sum.
  for (int64_t k = 0; k < n; ++k) {
    const V* partial = lane_grads + k * width;
    scalar_t* eg = entry_grads + (first + tg.entry[k]) * 6;
    scalar_t* ec = entry_colors + (first + tg.entry[k]) * channels;
    for (int64_t v = 0; v < width; ++v) {
      scalar_t sum = 0;
      for (int l = 0; l < kLanes; ++l) sum += partial[v][l];
      (v < 6 ? eg[v] : ec[v - 6]) = sum;
    }
  }
}

// The compiled entry points of one tile (float32 cloned per ISA; float64 is the exact path that
// the tests compare with the reference, and gains little from vector units).
TESSERA_AVX2_CLONES void forward_tile(const Inputs<float>& in, const Grid& grid, int64_t tile,
                                        TileGaussians<float>& tg, LaneScratch<float>& scratch,
                                        float* out_colors, float* out_alphas, int32_t* out_last,
                                        float* out_transmittance) {
  forward_tile_impl(in, grid, tile, tg, scratch, out_colors, out_alphas, out_last,
                    out_transmittance);
}
void forward_tile(const Inputs<double>& in, const Grid& grid, int64_t tile,
                  TileGaussians<double>& tg, LaneScratch<double>& scratch, double* out_colors,
                  double* out_alphas, int32_t* out_last, double* out_transmittance) {
  forward_tile_impl(in, grid, tile, tg, scratch, out_colors, out_alphas, out_last,
                    out_transmittance);
}
TESSERA_AVX2_CLONES void backward_tile(const Inputs<float>& in, const Grid& grid, int64_t tile,
                                         int64_t first, int64_t top, TileGaussians<float>& tg,
                                         LaneScratch<float>& scratch, const int32_t* last_ids,
                                         const float* transmittance, const float* v_colors,
                                         const float* v_alphas, float* entry_grads,
                                         float* entry_colors, float* tile_background) {
  backward_tile_impl(in, grid, tile, first, top, tg, scratch, last_ids, transmittance, v_colors,
                     v_alphas, entry_grads, entry_colors, tile_background);
}
void backward_tile(const Inputs<double>& in, const Grid& grid, int64_t tile, int64_t first,
                   int64_t top, TileGaussians<double>& tg, LaneScratch<double>& scratch,
                   const int32_t* last_ids, const double* transmittance, const double* v_colors,
                   const double* v_alphas, double* entry_grads, double* entry_colors,
                   double* tile_background) {
  backward_tile_impl(in, grid, tile, first, top, tg, scratch, last_ids, transmittance, v_colors,
                     v_alphas, entry_grads, entry_colors, tile_background);
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
  tessera::parallel_for(0, num_gaussians, kGaussiansPerTask, [&](int64_t begin, int64_t end) {
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

// Checks every last_ids against its tile's list and returns each tile's top: the largest
// last_ids of its pixels, the entries backward walks.
std::vector<int64_t> tile_tops(const int32_t* last_ids, const int64_t* offsets, const Grid& grid) {
  std::vector<int64_t> top(grid.num_tiles(), 0);
  for (int64_t i = 0; i < grid.height; ++i)
    for (int64_t j = 0; j < grid.width; ++j) {
      const int64_t tile = (i / grid.tile_size) * grid.tiles_x + j / grid.tile_size;
      const int64_t size = offsets[tile + 1] - offsets[tile];
      const int32_t last = last_ids[i * grid.width + j];
      TORCH_CHECK(0 <= last && last <= size, "rasterize_gaussians_bwd: last_ids[", i, ", ", j,
                  "] = ", last, " does not fit its tile's ", size, " entries");
      top[tile] = std::max<int64_t>(top[tile], last);
    }
  return top;
}

template <typename scalar_t>
Inputs<scalar_t> inputs_of(const torch::Tensor& m, const torch::Tensor& con,
                           const torch::Tensor& col, const torch::Tensor& op,
                           const torch::Tensor& bg, const torch::Tensor& off,
                           const torch::Tensor& ids) {
  return {m.data_ptr<scalar_t>(),     con.data_ptr<scalar_t>(),   col.data_ptr<scalar_t>(),
          op.data_ptr<scalar_t>(),    optional_ptr<scalar_t>(bg), off.data_ptr<int64_t>(),
          ids.data_ptr<int64_t>(),    m.size(0),                  col.size(1)};
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
  check_ids(ids.data_ptr<int64_t>(), ids.size(0), m.size(0));
  if (width == 0 || height == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "rasterize_gaussians_fwd_cpu", [&] {
    Inputs<scalar_t> in = inputs_of<scalar_t>(m, con, col, op, bg, off, ids);
    const std::vector<Splat<scalar_t>> splats = pack_splats(in);
    in.splats = splats.data();
    scalar_t* colors_out = out.colors.data_ptr<scalar_t>();
    scalar_t* alphas_out = out.alphas.data_ptr<scalar_t>();
    int32_t* last_out = out.last_ids.data_ptr<int32_t>();
    scalar_t* trans_out = out.transmittance.data_ptr<scalar_t>();
    const TileOrder order(grid.num_tiles());
    tessera::parallel_for(0, grid.num_tiles(), 1, [&](int64_t begin, int64_t end) {
      TileGaussians<scalar_t> tg;
      LaneScratch<scalar_t> scratch;
      for (int64_t k = begin; k < end; ++k)
        forward_tile(in, grid, order(k), tg, scratch, colors_out, alphas_out, last_out,
                     trans_out);
    });
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
  check_ids(ids.data_ptr<int64_t>(), num_isects, n);
  // Only the entries some pixel reached get gradients: the first top[t] of each tile's list,
  // rows [active[t], active[t] + top[t]) of the buffers (a small share of M when the lists are
  // long and the pixels saturate early), with their Gaussian ids in active_ids.
  const std::vector<int64_t> top = tile_tops(last.data_ptr<int32_t>(), off.data_ptr<int64_t>(), grid);
  std::vector<int64_t> active(grid.num_tiles() + 1, 0);
  for (int64_t t = 0; t < grid.num_tiles(); ++t) active[t + 1] = active[t] + top[t];
  const int64_t num_active = active[grid.num_tiles()];
  std::vector<int64_t> active_ids(num_active);
  {
    const int64_t* off_p = off.data_ptr<int64_t>();
    const int64_t* ids_p = ids.data_ptr<int64_t>();
    for (int64_t t = 0; t < grid.num_tiles(); ++t)
      std::copy(ids_p + off_p[t], ids_p + off_p[t] + top[t], active_ids.begin() + active[t]);
  }
  const torch::Tensor entry_grads = torch::zeros({num_active, 6}, options);
  const torch::Tensor entry_colors = torch::zeros({num_active, channels}, options);
  const torch::Tensor tile_background = torch::zeros({grid.num_tiles(), channels}, options);
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "rasterize_gaussians_bwd_cpu", [&] {
    Inputs<scalar_t> in = inputs_of<scalar_t>(m, con, col, op, bg, off, ids);
    const std::vector<Splat<scalar_t>> splats = pack_splats(in);
    in.splats = splats.data();
    if (width > 0 && height > 0) {
      const int32_t* last_p = last.data_ptr<int32_t>();
      const scalar_t* trans_p = trans.data_ptr<scalar_t>();
      const scalar_t* v_colors_p = optional_ptr<scalar_t>(g_colors);
      const scalar_t* v_alphas_p = optional_ptr<scalar_t>(g_alphas);
      scalar_t* eg = entry_grads.data_ptr<scalar_t>();
      scalar_t* ec = entry_colors.data_ptr<scalar_t>();
      scalar_t* tb = tile_background.data_ptr<scalar_t>();
      const TileOrder order(grid.num_tiles());
      tessera::parallel_for(0, grid.num_tiles(), 1, [&](int64_t begin, int64_t end) {
        TileGaussians<scalar_t> tg;
        LaneScratch<scalar_t> scratch;
        for (int64_t k = begin; k < end; ++k) {
          const int64_t t = order(k);
          backward_tile(in, grid, t, active[t], top[t], tg, scratch, last_p, trans_p,
                        v_colors_p, v_alphas_p, eg, ec, tb);
        }
      });
    }
    reduce_entries<scalar_t>(active_ids.data(), num_active, n, channels,
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
