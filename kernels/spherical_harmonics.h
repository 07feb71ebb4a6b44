// spherical_harmonics: view-dependent RGB colour of each Gaussian from its real spherical-
// harmonics coefficients (degrees 0..3), with the constants and signs of INRIA 3DGS and gsplat.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::kernels {

// Highest SH degree supported: 16 coefficients per channel (INRIA's f_dc_0..2 + f_rest_0..44).
constexpr int kMaxShDegree = 3;

// Per Gaussian i, with n = dirs[i] / |dirs[i]| = (x, y, z) and the basis of INRIA 3DGS / gsplat
// (C0 = 0.28209479177387814, C1 = 0.4886025119029199, C2 = {1.0925484305920792,
// -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396},
// C3 = {-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
// -0.4570457994644658, 1.445305721320277, -0.5900435899266435}):
//   Y_0 = C0
//   Y_1..3 = -C1 y, C1 z, -C1 x
//   Y_4..8 = C2[0] xy, C2[1] yz, C2[2] (2zz - xx - yy), C2[3] xz, C2[4] (xx - yy)
//   Y_9..15 = C3[0] y (3xx - yy), C3[1] xyz, C3[2] y (4zz - xx - yy), C3[3] z (2zz - 3xx - 3yy),
//             C3[4] x (4zz - xx - yy), C3[5] z (xx - yy), C3[6] x (xx - 3yy)
//   colors[i, c] = max(sum_{k < (degree+1)^2} Y_k(n) coeffs[i, k, c] + 0.5, 0)
// The clamp passes no gradient where the sum + 0.5 < 0. Coefficients above the active degree
// are not read and get zero gradient. For degree 0 dirs get zero gradient.
//
// The differentiable op. Dispatches to the CPU or the CUDA implementation by the inputs' device.
//   degree in [0, 3]; K in {1, 4, 9, 16} (= (max_degree + 1)^2) and K >= (degree + 1)^2.
//   The coefficients come as a 3DGS model holds them, in two tensors: dc [N, 1, 3] (coefficient
//   0, INRIA's f_dc) and rest [N, K - 1, 3] (f_rest; [N, 0, 3] at K = 1), so that no [N, K, 3]
//   copy of both is made in the forward nor its gradient in the backward: at K = 16 that copy
//   and its gradient were 384 bytes per Gaussian of a 3DGS step's peak.
//   dirs, dc and rest: one floating dtype (float32 or float64), one device, any strides; dirs
//   must be non-zero (normalized inside; the gradient flows to dirs through the normalization).
// Gradients flow to dirs, dc and rest.
at::Tensor spherical_harmonics(
    int64_t degree,             // active degree, 0..3
    const at::Tensor& dirs,     // [N, 3] viewing directions (e.g. mean - camera centre)
    const at::Tensor& dc,       // [N, 1, 3] coefficient 0
    const at::Tensor& rest);    // [N, K - 1, 3] coefficients 1..K-1
// Returns colors [N, 3].

// The same on one coefficient tensor [N, K, 3] (coeffs[:, 0] the DC term), split into views.
at::Tensor spherical_harmonics(int64_t degree, const at::Tensor& dirs, const at::Tensor& coeffs);

// Gradients of the backward pass.
struct SphericalHarmonicsGrads {
  at::Tensor v_dirs;  // [N, 3]
  at::Tensor v_dc;    // [N, 1, 3]
  at::Tensor v_rest;  // [N, K - 1, 3]
};

// The two implementations take the same arguments and return the same tensors. They expect
// inputs validated by spherical_harmonics and accept any strides. Arithmetic is in the inputs'
// dtype. Backward needs a defined v_colors (the autograd wrapper passes zeros when the output
// is unused). The CPU backward is deterministic (one thread per Gaussian, no atomics).
namespace cpu {
at::Tensor spherical_harmonics_fwd(
    // forward inputs
    int64_t degree,
    const at::Tensor& dirs,   // [N, 3]
    const at::Tensor& dc,     // [N, 1, 3]
    const at::Tensor& rest);  // [N, K - 1, 3]
// Returns colors [N, 3].

SphericalHarmonicsGrads spherical_harmonics_bwd(
    // forward inputs
    int64_t degree,
    const at::Tensor& dirs,       // [N, 3]
    const at::Tensor& dc,         // [N, 1, 3]
    const at::Tensor& rest,       // [N, K - 1, 3]
    // grad outputs
    const at::Tensor& v_colors);  // [N, 3]
}  // namespace cpu

namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA). One thread per Gaussian; the current
// stream.
at::Tensor spherical_harmonics_fwd(
    // forward inputs
    int64_t degree,
    const at::Tensor& dirs,   // [N, 3]
    const at::Tensor& dc,     // [N, 1, 3]
    const at::Tensor& rest);  // [N, K - 1, 3]
// Returns colors [N, 3].

SphericalHarmonicsGrads spherical_harmonics_bwd(
    // forward inputs
    int64_t degree,
    const at::Tensor& dirs,       // [N, 3]
    const at::Tensor& dc,         // [N, 1, 3]
    const at::Tensor& rest,       // [N, K - 1, 3]
    // grad outputs
    const at::Tensor& v_colors);  // [N, 3]
}  // namespace cuda

}  // namespace tessera::kernels
