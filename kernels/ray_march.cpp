// ray_march's entry point: input checks (shapes, dtypes, devices, the box and the step sizes) and
// the dispatch between the CPU and CUDA implementations.
#include "kernels/ray_march.h"
#include "kernels/device_dispatch.h"

#include <cmath>

namespace tessera::kernels {

namespace {

void check_inputs(const torch::Tensor& origins, const torch::Tensor& directions,
                  const torch::Tensor& near, const torch::Tensor& far, const torch::Tensor& aabb,
                  const torch::Tensor& occupancy, const RayMarchParams& params) {
  TORCH_CHECK(origins.dim() == 2 && origins.size(1) == 3,
              "ray_march: origins must be [R, 3], got ", origins.sizes());
  const int64_t num_rays = origins.size(0);
  TORCH_CHECK(directions.sizes() == origins.sizes(),
              "ray_march: directions must be [R, 3] with R = ", num_rays, ", got ",
              directions.sizes());
  TORCH_CHECK(near.dim() == 1 && near.size(0) == num_rays,
              "ray_march: near must be [R] with R = ", num_rays, ", got ", near.sizes());
  TORCH_CHECK(far.dim() == 1 && far.size(0) == num_rays,
              "ray_march: far must be [R] with R = ", num_rays, ", got ", far.sizes());
  TORCH_CHECK(aabb.dim() == 1 && aabb.size(0) == 6,
              "ray_march: aabb must be [6] (xmin, ymin, zmin, xmax, ymax, zmax), got ",
              aabb.sizes());
  for (const torch::Tensor* t : {&origins, &directions, &near, &far, &aabb})
    TORCH_CHECK(t->scalar_type() == torch::kFloat32,
                "ray_march: origins, directions, near, far and aabb must be float32, got ",
                t->scalar_type());
  TORCH_CHECK(occupancy.dim() == 3 && occupancy.size(0) > 0 && occupancy.size(1) > 0 &&
                  occupancy.size(2) > 0,
              "ray_march: occupancy must be a non-empty [Gx, Gy, Gz] grid, got ",
              occupancy.sizes());
  TORCH_CHECK(occupancy.scalar_type() == torch::kUInt8 || occupancy.scalar_type() == torch::kBool,
              "ray_march: occupancy must be uint8 or bool, got ", occupancy.scalar_type());
  for (const torch::Tensor* t : {&directions, &near, &far, &occupancy})
    TORCH_CHECK(t->device() == origins.device(), "ray_march: origins, directions, near, far and "
                "occupancy must be on one device (", origins.device(), "), got one on ",
                t->device());
  TORCH_CHECK(std::isfinite(params.step_size) && params.step_size > 0.0f,
              "ray_march: step_size must be finite and > 0, got ", params.step_size);
  TORCH_CHECK(std::isfinite(params.cone_angle) && params.cone_angle >= 0.0f,
              "ray_march: cone_angle must be finite and >= 0, got ", params.cone_angle);
  TORCH_CHECK(params.max_step >= params.step_size,
              "ray_march: max_step (", params.max_step, ") must be >= step_size (",
              params.step_size, ")");
  TORCH_CHECK(params.max_samples_per_ray >= 0,
              "ray_march: max_samples_per_ray must be >= 0, got ", params.max_samples_per_ray);
}

// The box's values, read on the host: finite, and lo < hi on every axis.
void check_box(const torch::Tensor& aabb) {  // [6] on the CPU
  const float* box = aabb.data_ptr<float>();
  for (int a = 0; a < 3; ++a)
    TORCH_CHECK(std::isfinite(box[a]) && std::isfinite(box[a + 3]) && box[a] < box[a + 3],
                "ray_march: aabb must be finite with min < max on every axis, got axis ", a,
                ": [", box[a], ", ", box[a + 3], "]");
}

}  // namespace

RayMarchOutput ray_march(const torch::Tensor& origins, const torch::Tensor& directions,
                         const torch::Tensor& near, const torch::Tensor& far,
                         const torch::Tensor& aabb, const torch::Tensor& occupancy,
                         const RayMarchParams& params) {
  check_inputs(origins, directions, near, far, aabb, occupancy, params);
  const torch::Tensor box = aabb.detach().to(torch::kCPU).contiguous();
  check_box(box);
  const torch::NoGradGuard no_grad;  // sampler outputs: no graph, whatever the inputs
  return on_device(
      "ray_march", origins,
      [&] { return cpu::ray_march_fwd(origins, directions, near, far, box, occupancy, params); },
      [&] { return cuda::ray_march_fwd(origins, directions, near, far, box, occupancy, params); });
}

}  // namespace tessera::kernels
