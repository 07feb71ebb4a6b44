// Math shared by the CPU and CUDA tile binning and rasterization of 2D Gaussians: the tile rect
// of a Gaussian, the per-pixel alpha with its skip rules, and the named constants of the rules.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace tessera::kernels::raster {

// Caps a Gaussian's alpha so that (1 - alpha) >= 0.01: transmittance never reaches 0, which keeps
// the backward's division T_k = T_{k+1} / (1 - alpha_k) finite (as in INRIA 3DGS).
constexpr double kMaxAlpha = 0.99;
// Alphas below one 8-bit colour step (1/255) are skipped: they cannot change a stored pixel, and
// skipping them bounds the work in the far tails of each Gaussian (INRIA and gsplat).
constexpr double kMinAlpha = 1.0 / 255.0;
// A pixel stops before the Gaussian that would take its transmittance below this: what is left
// could add at most 1e-4 to any channel, under 8-bit resolution (INRIA convention).
constexpr double kTransmittanceStop = 1e-4;

// Host code takes std:: math, device code CUDA's global overloads.
#ifdef __CUDA_ARCH__
TESSERA_HD inline float exp_of(float x) { return expf(x); }
TESSERA_HD inline double exp_of(double x) { return exp(x); }
TESSERA_HD inline double floor_of(double x) { return floor(x); }
TESSERA_HD inline bool finite(double x) { return isfinite(x); }
TESSERA_HD inline double log_of(double x) { return log(x); }
#else
inline float exp_of(float x) { return std::exp(x); }
inline double exp_of(double x) { return std::exp(x); }
inline double floor_of(double x) { return std::floor(x); }
inline bool finite(double x) { return std::isfinite(x); }
inline double log_of(double x) { return std::log(x); }
#endif

// The tiles [x0, x1) x [y0, y1) a Gaussian touches: the bounding square with centre (mx, my) and
// half-width `radius` pixels, clipped to the tile grid, by the gsplat/INRIA getRect rule:
//   x0 = clamp(floor((mx - r) / ts), 0, tiles_x),  x1 = clamp(floor((mx + r + ts - 1) / ts), 0,
//   tiles_x), likewise in y; computed in double (exact for float32 and int32 inputs). Empty
// (x0 == x1 or y0 == y1) for radius <= 0 and for a non-finite centre.
struct TileRect {
  int64_t x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  TESSERA_HD int64_t count() const { return (x1 - x0) * (y1 - y0); }
};

TESSERA_HD inline int64_t clamp_tile(double v, int64_t hi) {
  // v is finite here; compare in double before converting so huge values cannot overflow.
  const double f = floor_of(v);
  if (f <= 0.0) return 0;
  if (f >= static_cast<double>(hi)) return hi;
  return static_cast<int64_t>(f);
}

TESSERA_HD inline TileRect tile_rect(double mx, double my, int32_t radius, int64_t tile_size,
                                     int64_t tiles_x, int64_t tiles_y) {
  TileRect r;
  if (radius <= 0 || !finite(mx) || !finite(my)) return r;
  const double rad = static_cast<double>(radius);
  const double ts = static_cast<double>(tile_size);
  r.x0 = clamp_tile((mx - rad) / ts, tiles_x);
  r.x1 = clamp_tile((mx + rad + ts - 1.0) / ts, tiles_x);
  r.y0 = clamp_tile((my - rad) / ts, tiles_y);
  r.y1 = clamp_tile((my + rad + ts - 1.0) / ts, tiles_y);
  if (r.x1 < r.x0) r.x1 = r.x0;
  if (r.y1 < r.y0) r.y1 = r.y0;
  return r;
}

// The rect of Gaussian g of the binning inputs (means [N, 2], radii [N], depths [N]): empty when
// culled (non-finite depth, radius <= 0 or a non-finite centre).
template <typename T>
TESSERA_HD inline TileRect gaussian_tile_rect(const T* means, const int32_t* radii,
                                              const T* depths, int64_t g, int64_t tile_size,
                                              int64_t tiles_x, int64_t tiles_y) {
  if (!finite(static_cast<double>(depths[g]))) return TileRect{};
  return tile_rect(static_cast<double>(means[2 * g]), static_cast<double>(means[2 * g + 1]),
                   radii[g], tile_size, tiles_x, tiles_y);
}

// The tiles of `r` that are in the mask ([tiles_y * tiles_x], row-major), or all when the mask
// is null.
TESSERA_HD inline int64_t unmasked_tiles(const TileRect& r, const bool* mask, int64_t tiles_x) {
  if (!mask) return r.count();
  int64_t count = 0;
  for (int64_t ty = r.y0; ty < r.y1; ++ty)
    for (int64_t tx = r.x0; tx < r.x1; ++tx) count += mask[ty * tiles_x + tx] ? 1 : 0;
  return count;
}

// The Mahalanobis half-distance of the pixel centre (px, py) from a Gaussian with mean (mx, my)
// and conic (a, b, c) = inverse 2D covariance [[a, b], [b, c]]; dx = mx - px, dy = my - py:
//   sigma = 0.5 * (a dx^2 + c dy^2) + b dx dy.
template <typename scalar_t>
TESSERA_HD inline scalar_t pair_sigma(scalar_t a, scalar_t b, scalar_t c, scalar_t dx,
                                      scalar_t dy) {
  return scalar_t(0.5) * (a * dx * dx + c * dy * dy) + b * dx * dy;
}

template <typename scalar_t>
struct PixelAlpha {
  scalar_t dx, dy;  // mean - pixel centre
  scalar_t gauss;   // exp(-sigma)
  scalar_t alpha;   // min(kMaxAlpha, opacity * gauss)
  bool capped;      // opacity * gauss > kMaxAlpha: alpha is constant, no gradient through it
  bool skip;        // sigma < 0 or alpha < kMinAlpha: the Gaussian is passed over
};

template <typename scalar_t>
TESSERA_HD inline PixelAlpha<scalar_t> pixel_alpha(scalar_t mx, scalar_t my, scalar_t a,
                                                   scalar_t b, scalar_t c, scalar_t opacity,
                                                   scalar_t px, scalar_t py) {
  PixelAlpha<scalar_t> p;
  p.dx = mx - px;
  p.dy = my - py;
  const scalar_t sigma = pair_sigma(a, b, c, p.dx, p.dy);
  p.gauss = 0;
  p.alpha = 0;
  p.capped = false;
  p.skip = true;
  if (!(sigma >= scalar_t(0))) return p;  // sigma < 0 (or NaN): skipped
  p.gauss = exp_of(-sigma);
  const scalar_t raw = opacity * p.gauss;
  p.capped = raw > static_cast<scalar_t>(kMaxAlpha);
  p.alpha = p.capped ? static_cast<scalar_t>(kMaxAlpha) : raw;
  p.skip = p.alpha < static_cast<scalar_t>(kMinAlpha);
  return p;
}

// The sigma beyond which a Gaussian of this opacity is certainly skipped: opacity * exp(-sigma)
// < kMinAlpha for every sigma > ln(opacity / kMinAlpha), and the 1e-3 margin (alpha 0.1% under
// the threshold) absorbs the rounding of exp and of sigma. A pair whose sigma exceeds it needs no
// exp: pixel_alpha would skip it. -inf for opacity <= 0 (always skipped); +inf for a NaN opacity
// (pixel_alpha lets its NaN alpha through, so nothing may be culled).
TESSERA_HD inline double skip_sigma(double opacity) {
  if (opacity != opacity) return HUGE_VAL;
  if (opacity <= 0.0) return -HUGE_VAL;
  return log_of(opacity / kMinAlpha) + 1e-3;
}

// Gradients of one (pixel, Gaussian) pair from dL/dalpha: through alpha = opacity * exp(-sigma)
// (zero when capped) to the opacity, the conic and the mean.
template <typename scalar_t>
struct PairGrads {
  scalar_t v_mx, v_my, v_a, v_b, v_c, v_opacity;
};

template <typename scalar_t>
TESSERA_HD inline PairGrads<scalar_t> pair_grads(const PixelAlpha<scalar_t>& p, scalar_t a,
                                                 scalar_t b, scalar_t c, scalar_t opacity,
                                                 scalar_t v_alpha) {
  PairGrads<scalar_t> g{0, 0, 0, 0, 0, 0};
  if (p.capped) return g;
  g.v_opacity = p.gauss * v_alpha;
  const scalar_t v_sigma = -opacity * p.gauss * v_alpha;
  g.v_a = scalar_t(0.5) * p.dx * p.dx * v_sigma;
  g.v_b = p.dx * p.dy * v_sigma;
  g.v_c = scalar_t(0.5) * p.dy * p.dy * v_sigma;
  g.v_mx = (a * p.dx + b * p.dy) * v_sigma;
  g.v_my = (b * p.dx + c * p.dy) * v_sigma;
  return g;
}

}  // namespace tessera::kernels::raster
