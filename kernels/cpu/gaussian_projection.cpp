// CPU project_gaussians_fwd / project_gaussians_bwd: Gaussians split across threads by
// at::parallel_for, the per-Gaussian math of kernels/gaussian_projection_math.h.
#include "kernels/cpu/parallel.h"
#include "kernels/gaussian_projection.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "kernels/gaussian_projection_math.h"
#include "kernels/tensor_args.h"

namespace tessera::kernels::cpu {

namespace {

namespace pm = projection_math;

// Gaussians per parallel task. One Gaussian costs ~0.1 us forward and ~0.2 us backward
// (bench_gaussian_projection), so 2048 of them are a few hundred microseconds: far above the
// cost of handing out a task, and 100k Gaussians still split into ~50 tasks.
constexpr int64_t kGaussiansPerTask = 2048;

template <typename T>
pm::Camera<T> make_camera(const torch::Tensor& viewmat,  // [4, 4], CPU, contiguous, dtype T
                          const ProjectionCamera& c) {
  pm::Camera<T> cam = pm::camera_intrinsics<T>(c);
  pm::set_pose(viewmat.data_ptr<T>(), cam);
  return cam;
}

}  // namespace

ProjectionOutput project_gaussians_fwd(const torch::Tensor& means, const torch::Tensor& quats,
                                       const torch::Tensor& scales, const torch::Tensor& viewmat,
                                       const ProjectionCamera& camera) {
  const torch::Tensor mean = means.contiguous(), quat = quats.contiguous(),
                      scale = scales.contiguous(), view = viewmat.contiguous();
  const int64_t n = mean.size(0);
  const auto options = mean.options();
  ProjectionOutput out;
  out.radii = torch::empty({n}, options.dtype(torch::kInt32));
  out.means2d = torch::empty({n, 2}, options);
  out.depths = torch::empty({n}, options);
  out.conics = torch::empty({n, 3}, options);
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(mean.scalar_type(), "project_gaussians_fwd_cpu", [&] {
    const pm::Camera<scalar_t> cam = make_camera<scalar_t>(view, camera);
    const scalar_t* m = mean.data_ptr<scalar_t>();
    const scalar_t* q = quat.data_ptr<scalar_t>();
    const scalar_t* s = scale.data_ptr<scalar_t>();
    int32_t* radii = out.radii.data_ptr<int32_t>();
    scalar_t* means2d = out.means2d.data_ptr<scalar_t>();
    scalar_t* depths = out.depths.data_ptr<scalar_t>();
    scalar_t* conics = out.conics.data_ptr<scalar_t>();
    tessera::parallel_for(0, n, kGaussiansPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        radii[i] = pm::project_forward<scalar_t>(m + 3 * i, q + 4 * i, s + 3 * i, cam,
                                                 means2d + 2 * i, depths + i, conics + 3 * i);
    });
  });
  return out;
}

ProjectionGrads project_gaussians_bwd(const torch::Tensor& means, const torch::Tensor& quats,
                                      const torch::Tensor& scales, const torch::Tensor& viewmat,
                                      const ProjectionCamera& camera, const torch::Tensor& radii,
                                      const torch::Tensor& v_means2d,
                                      const torch::Tensor& v_depths,
                                      const torch::Tensor& v_conics) {
  const torch::Tensor mean = means.contiguous(), quat = quats.contiguous(),
                      scale = scales.contiguous(), view = viewmat.contiguous(),
                      radius = radii.contiguous();
  const torch::Tensor g_means2d = contiguous_or_undefined(v_means2d),
                      g_depths = contiguous_or_undefined(v_depths),
                      g_conics = contiguous_or_undefined(v_conics);
  const int64_t n = mean.size(0);
  const auto options = mean.options();
  ProjectionGrads grads;
  grads.v_means = torch::empty({n, 3}, options);
  grads.v_quats = torch::empty({n, 4}, options);
  grads.v_scales = torch::empty({n, 3}, options);
  if (n == 0) return grads;
  AT_DISPATCH_FLOATING_TYPES(mean.scalar_type(), "project_gaussians_bwd_cpu", [&] {
    const pm::Camera<scalar_t> cam = make_camera<scalar_t>(view, camera);
    const scalar_t* m = mean.data_ptr<scalar_t>();
    const scalar_t* q = quat.data_ptr<scalar_t>();
    const scalar_t* s = scale.data_ptr<scalar_t>();
    const int32_t* r = radius.data_ptr<int32_t>();
    const scalar_t* vm2 = optional_ptr<scalar_t>(g_means2d);
    const scalar_t* vd = optional_ptr<scalar_t>(g_depths);
    const scalar_t* vc = optional_ptr<scalar_t>(g_conics);
    scalar_t* v_m = grads.v_means.data_ptr<scalar_t>();
    scalar_t* v_q = grads.v_quats.data_ptr<scalar_t>();
    scalar_t* v_s = grads.v_scales.data_ptr<scalar_t>();
    tessera::parallel_for(0, n, kGaussiansPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (r[i] <= 0) {
          for (int k = 0; k < 3; ++k) v_m[3 * i + k] = v_s[3 * i + k] = 0;
          for (int k = 0; k < 4; ++k) v_q[4 * i + k] = 0;
          continue;
        }
        pm::project_backward<scalar_t>(m + 3 * i, q + 4 * i, s + 3 * i, cam,
                                       vm2 ? vm2 + 2 * i : nullptr, vd ? vd + i : nullptr,
                                       vc ? vc + 3 * i : nullptr, v_m + 3 * i, v_q + 4 * i,
                                       v_s + 3 * i);
      }
    });
  });
  return grads;
}

}  // namespace tessera::kernels::cpu
