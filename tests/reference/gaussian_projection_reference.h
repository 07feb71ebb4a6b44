// Plain-LibTorch references of project_gaussians (EWA splatting) and spherical_harmonics, written
// from the formulas in kernels/gaussian_projection.h and kernels/spherical_harmonics.h with
// ordinary tensor ops, so autograd gives their gradients. Self-contained: depends on torch only.
#pragma once

#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace tessera::test {

struct ReferenceProjection {
  torch::Tensor radii;          // [N] int32, 0 = culled
  torch::Tensor means2d;        // [N, 2]
  torch::Tensor depths;         // [N]
  torch::Tensor conics;         // [N, 3]
  torch::Tensor radius_before_ceil;  // [N] 3 sqrt(lambda_max) (detached; NaN-free, 0 if culled
                                     // by depth or det): tests use it to spot ceil boundaries
};

// Rotation matrices [N, 3, 3] of the quaternions (w, x, y, z) [N, 4], normalized first.
inline torch::Tensor reference_quat_to_rotmat(const torch::Tensor& quats) {  // [N, 4]
  const torch::Tensor q = quats / quats.norm(2, 1, true);
  const torch::Tensor w = q.select(1, 0), x = q.select(1, 1), y = q.select(1, 2),
                      z = q.select(1, 3);
  const std::vector<torch::Tensor> entries = {
      1 - 2 * (y * y + z * z), 2 * (x * y - w * z),     2 * (x * z + w * y),
      2 * (x * y + w * z),     1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
      2 * (x * z - w * y),     2 * (y * z + w * x),     1 - 2 * (x * x + y * y)};
  return torch::stack(entries, 1).view({-1, 3, 3});
}

// Differentiable with respect to means, quats and scales. Culled Gaussians produce zeros through
// torch::where, whose unselected branch gets zero gradient; their depth and det are replaced by
// 1 before any division so that no Inf or NaN reaches backward.
inline ReferenceProjection reference_project_gaussians(
    const torch::Tensor& means,    // [N, 3]
    const torch::Tensor& quats,    // [N, 4]
    const torch::Tensor& scales,   // [N, 3]
    const torch::Tensor& viewmat,  // [4, 4]
    double fx, double fy, double cx, double cy, int64_t width, int64_t height,
    double near_plane = 0.01, double far_plane = 1e10, double eps2d = 0.3) {
  const auto opts = means.options();
  const int64_t n = means.size(0);
  const torch::Tensor W = viewmat.slice(0, 0, 3).slice(1, 0, 3);  // [3, 3]
  const torch::Tensor t = viewmat.slice(0, 0, 3).select(1, 3);    // [3]
  const torch::Tensor p = torch::matmul(means, W.t()) + t;        // [N, 3]
  const torch::Tensor z_raw = p.select(1, 2);
  const torch::Tensor depth_ok = (z_raw >= near_plane) & (z_raw <= far_plane);
  const torch::Tensor z = torch::where(depth_ok, z_raw, torch::ones_like(z_raw));
  const torch::Tensor x = p.select(1, 0), y = p.select(1, 1);

  const torch::Tensor R = reference_quat_to_rotmat(quats);           // [N, 3, 3]
  const torch::Tensor M = R * scales.unsqueeze(1);                   // R diag(s)
  const torch::Tensor Sigma = torch::matmul(M, M.transpose(1, 2));   // [N, 3, 3]

  const double lim_x = 1.3 * 0.5 * static_cast<double>(width) / fx;
  const double lim_y = 1.3 * 0.5 * static_cast<double>(height) / fy;
  const torch::Tensor ux = torch::clamp(x / z, -lim_x, lim_x);
  const torch::Tensor uy = torch::clamp(y / z, -lim_y, lim_y);
  const torch::Tensor zero = torch::zeros({n}, opts);
  const torch::Tensor J = torch::stack({fx / z, zero, -fx * ux / z,  //
                                        zero, fy / z, -fy * uy / z}, 1).view({-1, 2, 3});
  const torch::Tensor T = torch::matmul(J, W);                                // [N, 2, 3]
  const torch::Tensor cov = torch::matmul(torch::matmul(T, Sigma), T.transpose(1, 2));
  const torch::Tensor a = cov.select(2, 0).select(1, 0) + eps2d;
  const torch::Tensor b = cov.select(2, 1).select(1, 0);
  const torch::Tensor c = cov.select(2, 1).select(1, 1) + eps2d;
  const torch::Tensor det_raw = a * c - b * b;
  const torch::Tensor det_ok = det_raw > 0;
  const torch::Tensor det = torch::where(det_ok, det_raw, torch::ones_like(det_raw));
  const torch::Tensor conic = torch::stack({c / det, -b / det, a / det}, 1);

  const torch::Tensor ad = a.detach(), bd = b.detach(), cd = c.detach();
  const torch::Tensor lambda = 0.5 * (ad + cd) + torch::sqrt(0.25 * (ad - cd) * (ad - cd) + bd * bd);
  const torch::Tensor kept = depth_ok & det_ok;
  const torch::Tensor before_ceil =
      torch::where(kept, 3.0 * torch::sqrt(lambda.clamp_min(0)), torch::zeros_like(lambda));
  const torch::Tensor r = torch::ceil(before_ceil);
  const torch::Tensor u = fx * x / z + cx;
  const torch::Tensor v = fy * y / z + cy;
  const torch::Tensor ud = u.detach(), vd = v.detach();
  const torch::Tensor off_image = (ud + r <= 0) | (ud - r >= static_cast<double>(width)) |
                                  (vd + r <= 0) | (vd - r >= static_cast<double>(height));
  const torch::Tensor valid = kept & ~off_image;

  ReferenceProjection out;
  out.radii = torch::where(valid, r, torch::zeros_like(r)).to(torch::kInt32);
  const torch::Tensor valid2 = valid.unsqueeze(1);
  out.means2d = torch::where(valid2, torch::stack({u, v}, 1), torch::zeros({n, 2}, opts));
  out.depths = torch::where(valid, z, zero);
  out.conics = torch::where(valid2, conic, torch::zeros({n, 3}, opts));
  out.radius_before_ceil = before_ceil;
  return out;
}

// colors [N, 3] = max(sum_k Y_k(dirs / |dirs|) coeffs[:, k] + 0.5, 0), k < (degree + 1)^2, with
// the basis of INRIA 3DGS / gsplat. Differentiable with respect to dirs and coeffs.
inline torch::Tensor reference_spherical_harmonics(int64_t degree,
                                                   const torch::Tensor& dirs,     // [N, 3]
                                                   const torch::Tensor& coeffs) { // [N, K, 3]
  const torch::Tensor n = dirs / dirs.norm(2, 1, true);
  const torch::Tensor x = n.select(1, 0), y = n.select(1, 1), z = n.select(1, 2);
  std::vector<torch::Tensor> basis = {torch::full_like(x, 0.28209479177387814)};
  if (degree >= 1) {
    const double c1 = 0.4886025119029199;
    basis.push_back(-c1 * y);
    basis.push_back(c1 * z);
    basis.push_back(-c1 * x);
  }
  if (degree >= 2) {
    const torch::Tensor xx = x * x, yy = y * y, zz = z * z;
    basis.push_back(1.0925484305920792 * x * y);
    basis.push_back(-1.0925484305920792 * y * z);
    basis.push_back(0.31539156525252005 * (2 * zz - xx - yy));
    basis.push_back(-1.0925484305920792 * x * z);
    basis.push_back(0.5462742152960396 * (xx - yy));
    if (degree >= 3) {
      basis.push_back(-0.5900435899266435 * y * (3 * xx - yy));
      basis.push_back(2.890611442640554 * x * y * z);
      basis.push_back(-0.4570457994644658 * y * (4 * zz - xx - yy));
      basis.push_back(0.3731763325901154 * z * (2 * zz - 3 * xx - 3 * yy));
      basis.push_back(-0.4570457994644658 * x * (4 * zz - xx - yy));
      basis.push_back(1.445305721320277 * z * (xx - yy));
      basis.push_back(-0.5900435899266435 * x * (xx - 3 * yy));
    }
  }
  const int64_t bases = static_cast<int64_t>(basis.size());
  const torch::Tensor Y = torch::stack(basis, 1);  // [N, bases]
  const torch::Tensor sum = (Y.unsqueeze(2) * coeffs.slice(1, 0, bases)).sum(1) + 0.5;
  return torch::clamp_min(sum, 0.0);
}

}  // namespace tessera::test
