// Per-Gaussian math of spherical_harmonics (view-dependent colour, degrees 0..3), forward and
// backward, shared by the CPU and the CUDA implementation: __host__ __device__ inline functions.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/host_device.h"

namespace tessera::kernels::sh_math {

// Real spherical-harmonics constants and sign conventions of INRIA 3DGS and gsplat, so that
// coefficients from their .ply files give the same colours.
constexpr double kC0 = 0.28209479177387814;
constexpr double kC1 = 0.4886025119029199;
// Degree 2 and 3 (the basis functions are listed in sh_basis). Scalars, not arrays: device code
// can read a constexpr scalar but not a host constexpr array.
constexpr double kC2_0 = 1.0925484305920792, kC2_1 = -1.0925484305920792,
                 kC2_2 = 0.31539156525252005, kC2_3 = -1.0925484305920792,
                 kC2_4 = 0.5462742152960396;
constexpr double kC3_0 = -0.5900435899266435, kC3_1 = 2.890611442640554,
                 kC3_2 = -0.4570457994644658, kC3_3 = 0.3731763325901154,
                 kC3_4 = -0.4570457994644658, kC3_5 = 1.445305721320277,
                 kC3_6 = -0.5900435899266435;
// Added to the SH sum before the clamp at 0: coefficients are stored around mid-grey.
constexpr double kColorOffset = 0.5;
constexpr int kMaxDegree = 3;
constexpr int kMaxBases = (kMaxDegree + 1) * (kMaxDegree + 1);

TESSERA_HD inline float sh_sqrt(float x) { return sqrtf(x); }
TESSERA_HD inline double sh_sqrt(double x) { return sqrt(x); }

// The (degree + 1)^2 basis values at the unit direction (x, y, z), and, when d_basis is not null,
// their partial derivatives d_basis[k][0..2] with respect to x, y, z (as independent variables).
template <typename T>
TESSERA_HD inline void sh_basis(int degree, T x, T y, T z, T* basis, T (*d_basis)[3]) {
  basis[0] = T(kC0);
  if (d_basis) d_basis[0][0] = d_basis[0][1] = d_basis[0][2] = 0;
  if (degree < 1) return;
  const T c1 = T(kC1);
  basis[1] = -c1 * y;
  basis[2] = c1 * z;
  basis[3] = -c1 * x;
  if (d_basis) {
    d_basis[1][0] = 0;   d_basis[1][1] = -c1; d_basis[1][2] = 0;
    d_basis[2][0] = 0;   d_basis[2][1] = 0;   d_basis[2][2] = c1;
    d_basis[3][0] = -c1; d_basis[3][1] = 0;   d_basis[3][2] = 0;
  }
  if (degree < 2) return;
  const T xx = x * x, yy = y * y, zz = z * z, xy = x * y, yz = y * z, xz = x * z;
  const T c20 = T(kC2_0), c21 = T(kC2_1), c22 = T(kC2_2), c23 = T(kC2_3), c24 = T(kC2_4);
  basis[4] = c20 * xy;
  basis[5] = c21 * yz;
  basis[6] = c22 * (2 * zz - xx - yy);
  basis[7] = c23 * xz;
  basis[8] = c24 * (xx - yy);
  if (d_basis) {
    d_basis[4][0] = c20 * y;      d_basis[4][1] = c20 * x;      d_basis[4][2] = 0;
    d_basis[5][0] = 0;            d_basis[5][1] = c21 * z;      d_basis[5][2] = c21 * y;
    d_basis[6][0] = -2 * c22 * x; d_basis[6][1] = -2 * c22 * y; d_basis[6][2] = 4 * c22 * z;
    d_basis[7][0] = c23 * z;      d_basis[7][1] = 0;            d_basis[7][2] = c23 * x;
    d_basis[8][0] = 2 * c24 * x;  d_basis[8][1] = -2 * c24 * y; d_basis[8][2] = 0;
  }
  if (degree < 3) return;
  const T c30 = T(kC3_0), c31 = T(kC3_1), c32 = T(kC3_2), c33 = T(kC3_3), c34 = T(kC3_4),
          c35 = T(kC3_5), c36 = T(kC3_6);
  basis[9] = c30 * y * (3 * xx - yy);
  basis[10] = c31 * xy * z;
  basis[11] = c32 * y * (4 * zz - xx - yy);
  basis[12] = c33 * z * (2 * zz - 3 * xx - 3 * yy);
  basis[13] = c34 * x * (4 * zz - xx - yy);
  basis[14] = c35 * z * (xx - yy);
  basis[15] = c36 * x * (xx - 3 * yy);
  if (d_basis) {
    d_basis[9][0] = c30 * 6 * xy;
    d_basis[9][1] = c30 * 3 * (xx - yy);
    d_basis[9][2] = 0;
    d_basis[10][0] = c31 * yz;
    d_basis[10][1] = c31 * xz;
    d_basis[10][2] = c31 * xy;
    d_basis[11][0] = -2 * c32 * xy;
    d_basis[11][1] = c32 * (4 * zz - xx - 3 * yy);
    d_basis[11][2] = 8 * c32 * yz;
    d_basis[12][0] = -6 * c33 * xz;
    d_basis[12][1] = -6 * c33 * yz;
    d_basis[12][2] = c33 * (6 * zz - 3 * xx - 3 * yy);
    d_basis[13][0] = c34 * (4 * zz - 3 * xx - yy);
    d_basis[13][1] = -2 * c34 * xy;
    d_basis[13][2] = 8 * c34 * xz;
    d_basis[14][0] = 2 * c35 * xz;
    d_basis[14][1] = -2 * c35 * yz;
    d_basis[14][2] = c35 * (xx - yy);
    d_basis[15][0] = 3 * c36 * (xx - yy);
    d_basis[15][1] = -6 * c36 * xy;
    d_basis[15][2] = 0;
  }
}

// The coefficients of one Gaussian come in two pieces, as a 3DGS model stores them: the DC row
// (coefficient 0) and the K - 1 rows above it. Row k, channel ch:
template <typename T>
TESSERA_HD inline T sh_coeff(const T* dc, const T* rest, int k, int ch) {
  return k == 0 ? dc[ch] : rest[3 * (k - 1) + ch];
}

// Forward for one Gaussian: colour[c] = max(sum_k basis_k(dir / |dir|) coeffs[k][c] + 0.5, 0).
template <typename T>
TESSERA_HD inline void sh_forward(int degree,
                                  const T* dir,   // [3]
                                  const T* dc,    // [3]: coefficient 0
                                  const T* rest,  // [K - 1, 3]: row k - 1 at rest + 3 (k - 1)
                                  T* color) {     // [3]
  const T norm = sh_sqrt(dir[0] * dir[0] + dir[1] * dir[1] + dir[2] * dir[2]);
  T basis[kMaxBases];
  sh_basis<T>(degree, dir[0] / norm, dir[1] / norm, dir[2] / norm, basis, nullptr);
  const int bases = (degree + 1) * (degree + 1);
  for (int ch = 0; ch < 3; ++ch) {
    T sum = 0;
    for (int k = 0; k < bases; ++k) sum += basis[k] * sh_coeff(dc, rest, k, ch);
    sum += T(kColorOffset);
    color[ch] = sum < 0 ? T(0) : sum;
  }
}

// Backward for one Gaussian: v_dc, v_rest for all K - 1 rows (zero above the active degree) and
// v_dir, from v_color. Channels clamped in forward (sum + 0.5 < 0) pass no gradient.
template <typename T>
TESSERA_HD inline void sh_backward(int degree, int num_bases,  // K
                                   const T* dir,      // [3]
                                   const T* dc,       // [3]
                                   const T* rest,     // [K - 1, 3]
                                   const T* v_color,  // [3]
                                   T* v_dc,           // [3]
                                   T* v_rest,         // [K - 1, 3]
                                   T* v_dir) {        // [3]
  const T norm = sh_sqrt(dir[0] * dir[0] + dir[1] * dir[1] + dir[2] * dir[2]);
  const T n[3] = {dir[0] / norm, dir[1] / norm, dir[2] / norm};
  T basis[kMaxBases];
  T d_basis[kMaxBases][3];
  sh_basis<T>(degree, n[0], n[1], n[2], basis, d_basis);
  const int bases = (degree + 1) * (degree + 1);
  T g[3];  // dL/d(sum) per channel, after the clamp
  for (int ch = 0; ch < 3; ++ch) {
    T sum = 0;
    for (int k = 0; k < bases; ++k) sum += basis[k] * sh_coeff(dc, rest, k, ch);
    sum += T(kColorOffset);
    g[ch] = sum < 0 ? T(0) : v_color[ch];
  }
  T v_n[3] = {0, 0, 0};
  for (int k = 0; k < bases; ++k) {
    T vk = 0;  // dL/dbasis_k
    T* v_row = k == 0 ? v_dc : v_rest + 3 * (k - 1);
    for (int ch = 0; ch < 3; ++ch) {
      v_row[ch] = g[ch] * basis[k];
      vk += g[ch] * sh_coeff(dc, rest, k, ch);
    }
    for (int i = 0; i < 3; ++i) v_n[i] += vk * d_basis[k][i];
  }
  for (int k = bases; k < num_bases; ++k)  // bases >= 1: rows of rest only
    v_rest[3 * (k - 1) + 0] = v_rest[3 * (k - 1) + 1] = v_rest[3 * (k - 1) + 2] = 0;
  // n = dir / |dir|: dL/ddir = (v_n - n (n . v_n)) / |dir|.
  const T n_dot = n[0] * v_n[0] + n[1] * v_n[1] + n[2] * v_n[2];
  for (int i = 0; i < 3; ++i) v_dir[i] = (v_n[i] - n[i] * n_dot) / norm;
}

}  // namespace tessera::kernels::sh_math
