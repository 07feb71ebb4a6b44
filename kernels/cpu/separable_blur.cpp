// separable_blur_cpu (kernels/separable_blur.h): per plane, a horizontal pass into a scratch
// plane, then a vertical pass, each as "for every tap, add tap * shifted row" so that the inner
// loop over x is a plain multiply-add over contiguous floats that the compiler vectorizes.
#include "kernels/cpu/cpu_build.h"
#include "kernels/cpu/parallel.h"
#include "kernels/separable_blur.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace tessera::kernels {
namespace {

// out[x] += g * in[x] for x in [0, n).
template <typename T>
inline __attribute__((always_inline)) void axpy(T* __restrict out, const T* __restrict in, T g, int64_t n) {
  for (int64_t x = 0; x < n; ++x) out[x] += g * in[x];
}

// One plane [h, w]: horizontal pass into `scratch` [h, w], vertical pass into `out` [h, w].
// `row` holds one input row with `r` zeros on each side.
template <typename T>
inline __attribute__((always_inline)) void blur_plane(const T* in, T* out, T* scratch, T* row,
                                                      int64_t h, int64_t w, const T* g,
                                                      int64_t taps) {
  const int64_t r = taps / 2;
  for (int64_t y = 0; y < h; ++y) {
    std::copy(in + y * w, in + (y + 1) * w, row + r);
    T* dst = scratch + y * w;
    std::fill(dst, dst + w, T(0));
    for (int64_t i = 0; i < taps; ++i) axpy(dst, row + i, g[i], w);
  }
  for (int64_t y = 0; y < h; ++y) {
    T* dst = out + y * w;
    std::fill(dst, dst + w, T(0));
    const int64_t first = std::max<int64_t>(0, r - y), last = std::min<int64_t>(taps, h + r - y);
    for (int64_t i = first; i < last; ++i) axpy(dst, scratch + (y + i - r) * w, g[i], w);
  }
}

// The cloned entry points (target_clones takes plain functions, not templates).
TESSERA_AVX2_CLONES void blur_plane_float(const float* in, float* out, float* scratch, float* row,
                                          int64_t h, int64_t w, const float* g, int64_t taps) {
  blur_plane(in, out, scratch, row, h, w, g, taps);
}
TESSERA_AVX2_CLONES void blur_plane_double(const double* in, double* out, double* scratch,
                                           double* row, int64_t h, int64_t w, const double* g,
                                           int64_t taps) {
  blur_plane(in, out, scratch, row, h, w, g, taps);
}
inline void blur_one(const float* in, float* out, float* scratch, float* row, int64_t h,
                     int64_t w, const float* g, int64_t taps) {
  blur_plane_float(in, out, scratch, row, h, w, g, taps);
}
inline void blur_one(const double* in, double* out, double* scratch, double* row, int64_t h,
                     int64_t w, const double* g, int64_t taps) {
  blur_plane_double(in, out, scratch, row, h, w, g, taps);
}

template <typename T>
void blur_all(const torch::Tensor& planes, const torch::Tensor& window, torch::Tensor& out) {
  const int64_t k = planes.size(0), h = planes.size(1), w = planes.size(2);
  const int64_t taps = window.size(0), r = taps / 2;
  const T* in = planes.data_ptr<T>();
  const T* g = window.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  tessera::parallel_for(0, k, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scratch(static_cast<size_t>(h * w));
    std::vector<T> row(static_cast<size_t>(w + 2 * r), T(0));
    for (int64_t p = begin; p < end; ++p)
      blur_one(in + p * h * w, dst + p * h * w, scratch.data(), row.data(), h, w, g, taps);
  });
}

}  // namespace

torch::Tensor separable_blur_cpu(const torch::Tensor& planes, const torch::Tensor& window) {
  if (!planes.defined() || !window.defined() || planes.dim() != 3 || window.dim() != 1 ||
      window.size(0) % 2 != 1 || !planes.device().is_cpu() || !window.device().is_cpu() ||
      planes.scalar_type() != window.scalar_type() ||
      (planes.scalar_type() != torch::kFloat32 && planes.scalar_type() != torch::kFloat64))
    throw std::invalid_argument(
        "separable_blur_cpu: expected CPU planes [K, H, W] and an odd window [L] of one dtype, "
        "float32 or float64");
  const torch::Tensor p = planes.contiguous(), g = window.contiguous();
  torch::Tensor out = torch::empty_like(p);
  if (p.numel() == 0) return out;
  if (p.scalar_type() == torch::kFloat32) blur_all<float>(p, g, out);
  else blur_all<double>(p, g, out);
  return out;
}

}  // namespace tessera::kernels
