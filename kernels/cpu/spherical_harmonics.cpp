// CPU spherical_harmonics_fwd / spherical_harmonics_bwd: Gaussians split across threads by
// at::parallel_for, the per-Gaussian math of kernels/spherical_harmonics_math.h.
#include "kernels/cpu/parallel.h"
#include "kernels/spherical_harmonics.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "kernels/spherical_harmonics_math.h"

namespace tessera::kernels::cpu {

namespace {

// Gaussians per parallel task: at degree 3 one Gaussian costs ~0.1 us forward on one core
// (bench_gaussian_projection), so a task is ~0.5 ms, well above the hand-out cost, and 100k
// Gaussians still split into ~25 tasks.
constexpr int64_t kGaussiansPerTask = 4096;

}  // namespace

torch::Tensor spherical_harmonics_fwd(int64_t degree, const torch::Tensor& dirs,
                                      const torch::Tensor& dc, const torch::Tensor& rest) {
  const torch::Tensor dir = dirs.contiguous(), dc_c = dc.contiguous(), rest_c = rest.contiguous();
  const int64_t n = dir.size(0);
  const int64_t r = rest_c.size(1);  // K - 1
  torch::Tensor colors = torch::empty({n, 3}, dir.options());
  if (n == 0) return colors;
  AT_DISPATCH_FLOATING_TYPES(dir.scalar_type(), "spherical_harmonics_fwd_cpu", [&] {
    const scalar_t* d = dir.data_ptr<scalar_t>();
    const scalar_t* c0 = dc_c.data_ptr<scalar_t>();
    const scalar_t* cr = rest_c.data_ptr<scalar_t>();
    scalar_t* out = colors.data_ptr<scalar_t>();
    const int deg = static_cast<int>(degree);
    tessera::parallel_for(0, n, kGaussiansPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        sh_math::sh_forward<scalar_t>(deg, d + 3 * i, c0 + 3 * i, cr + 3 * r * i, out + 3 * i);
    });
  });
  return colors;
}

SphericalHarmonicsGrads spherical_harmonics_bwd(int64_t degree, const torch::Tensor& dirs,
                                                const torch::Tensor& dc, const torch::Tensor& rest,
                                                const torch::Tensor& v_colors) {
  const torch::Tensor dir = dirs.contiguous(), dc_c = dc.contiguous(), rest_c = rest.contiguous(),
                      v_color = v_colors.contiguous();
  const int64_t n = dir.size(0);
  const int64_t r = rest_c.size(1);  // K - 1
  SphericalHarmonicsGrads grads;
  grads.v_dirs = torch::empty({n, 3}, dir.options());
  grads.v_dc = torch::empty({n, 1, 3}, dir.options());
  grads.v_rest = torch::empty({n, r, 3}, dir.options());
  if (n == 0) return grads;
  AT_DISPATCH_FLOATING_TYPES(dir.scalar_type(), "spherical_harmonics_bwd_cpu", [&] {
    const scalar_t* d = dir.data_ptr<scalar_t>();
    const scalar_t* c0 = dc_c.data_ptr<scalar_t>();
    const scalar_t* cr = rest_c.data_ptr<scalar_t>();
    const scalar_t* vc = v_color.data_ptr<scalar_t>();
    scalar_t* v_d = grads.v_dirs.data_ptr<scalar_t>();
    scalar_t* v_c0 = grads.v_dc.data_ptr<scalar_t>();
    scalar_t* v_cr = grads.v_rest.data_ptr<scalar_t>();
    const int deg = static_cast<int>(degree);
    const int bases = static_cast<int>(r + 1);
    tessera::parallel_for(0, n, kGaussiansPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        sh_math::sh_backward<scalar_t>(deg, bases, d + 3 * i, c0 + 3 * i, cr + 3 * r * i,
                                       vc + 3 * i, v_c0 + 3 * i, v_cr + 3 * r * i, v_d + 3 * i);
    });
  });
  return grads;
}

}  // namespace tessera::kernels::cpu
