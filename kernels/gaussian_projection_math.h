// Per-Gaussian math of project_gaussians (EWA splatting), forward and backward, shared by the CPU
// and the CUDA implementation: __host__ __device__ inline functions, plain C++ outside nvcc.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/host_device.h"

namespace tessera::kernels::projection_math {

// The x/z and y/z clamp of the local-affine Jacobian, in units of the half field of view: as
// INRIA 3DGS and gsplat do, Gaussians far outside the view keep a bounded Jacobian.
constexpr double kFovClampFactor = 1.3;
// Radius in standard deviations: 3 sigma holds 98.9% of a 2D Gaussian's mass.
constexpr double kSigmaRadius = 3.0;

TESSERA_HD inline float hd_sqrt(float x) { return sqrtf(x); }
TESSERA_HD inline double hd_sqrt(double x) { return sqrt(x); }
TESSERA_HD inline float hd_ceil(float x) { return ceilf(x); }
TESSERA_HD inline double hd_ceil(double x) { return ceil(x); }

// One camera, in the kernels' dtype. R and t are the rows of viewmat (world -> camera).
template <typename T>
struct Camera {
  T R[3][3];
  T t[3];
  T fx, fy, cx, cy;
  T lim_x, lim_y;  // kFovClampFactor * tan(half fov): 1.3 * 0.5 * width / fx, likewise for y
  T width, height;
  T near_plane, far_plane, eps2d;
};

// The intrinsics and limits of `c` (a ProjectionCamera: fx, fy, cx, cy, width, height,
// near_plane, far_plane, eps2d), filled on the host; R and t come from set_pose.
template <typename T, typename ProjectionCameraT>
inline Camera<T> camera_intrinsics(const ProjectionCameraT& c) {
  Camera<T> cam;
  cam.fx = static_cast<T>(c.fx);
  cam.fy = static_cast<T>(c.fy);
  cam.cx = static_cast<T>(c.cx);
  cam.cy = static_cast<T>(c.cy);
  cam.lim_x = static_cast<T>(kFovClampFactor * 0.5 * static_cast<double>(c.width) / c.fx);
  cam.lim_y = static_cast<T>(kFovClampFactor * 0.5 * static_cast<double>(c.height) / c.fy);
  cam.width = static_cast<T>(c.width);
  cam.height = static_cast<T>(c.height);
  cam.near_plane = static_cast<T>(c.near_plane);
  cam.far_plane = static_cast<T>(c.far_plane);
  cam.eps2d = static_cast<T>(c.eps2d);
  return cam;
}

// R and t from the first three rows of a row-major [4, 4] viewmat (world -> camera).
template <typename T>
TESSERA_HD inline void set_pose(const T* viewmat, Camera<T>& cam) {
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) cam.R[i][j] = viewmat[4 * i + j];
    cam.t[i] = viewmat[4 * i + 3];
  }
}

// Rotation matrix of a unit quaternion (w, x, y, z), row-major.
template <typename T>
TESSERA_HD inline void quat_to_rotmat(T w, T x, T y, T z, T R[3][3]) {
  R[0][0] = 1 - 2 * (y * y + z * z);
  R[0][1] = 2 * (x * y - w * z);
  R[0][2] = 2 * (x * z + w * y);
  R[1][0] = 2 * (x * y + w * z);
  R[1][1] = 1 - 2 * (x * x + z * z);
  R[1][2] = 2 * (y * z - w * x);
  R[2][0] = 2 * (x * z - w * y);
  R[2][1] = 2 * (y * z + w * x);
  R[2][2] = 1 - 2 * (x * x + y * y);
}

// Everything forward computes for one Gaussian; backward recomputes it (cheaper than storing).
template <typename T>
struct Projected {
  T p[3];        // camera-space mean
  T q[4];        // normalized quaternion
  T qnorm;       // |quat| before normalization
  T R[3][3];     // rotation of the normalized quaternion
  T M[3][3];     // R * diag(scales)
  T Sigma[3][3]; // M M^T, the 3D covariance
  T ux, uy;      // clamp(x/z), clamp(y/z)
  bool in_x, in_y;  // x/z, y/z inside the clamp (the clamp passes gradient)
  T Tm[2][3];    // J W, the linear map from world offsets to pixel offsets
  T a, b, c;     // blurred 2D covariance [[a, b], [b, c]]
  T det;
};

// Camera-space mean only: the depth test needs nothing else.
template <typename T>
TESSERA_HD inline void to_camera(const T* mean, const Camera<T>& cam, T p[3]) {
  for (int i = 0; i < 3; ++i)
    p[i] = cam.R[i][0] * mean[0] + cam.R[i][1] * mean[1] + cam.R[i][2] * mean[2] + cam.t[i];
}

// The 2D covariance of a Gaussian in front of the camera (p[2] > 0).
template <typename T>
TESSERA_HD inline void project_covariance(const T* quat, const T* scale, const Camera<T>& cam,
                                          Projected<T>& g) {
  g.qnorm = hd_sqrt(quat[0] * quat[0] + quat[1] * quat[1] + quat[2] * quat[2] + quat[3] * quat[3]);
  for (int i = 0; i < 4; ++i) g.q[i] = quat[i] / g.qnorm;
  quat_to_rotmat(g.q[0], g.q[1], g.q[2], g.q[3], g.R);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) g.M[i][j] = g.R[i][j] * scale[j];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      g.Sigma[i][j] = g.M[i][0] * g.M[j][0] + g.M[i][1] * g.M[j][1] + g.M[i][2] * g.M[j][2];

  const T z = g.p[2];
  const T rx = g.p[0] / z, ry = g.p[1] / z;
  g.in_x = rx >= -cam.lim_x && rx <= cam.lim_x;
  g.in_y = ry >= -cam.lim_y && ry <= cam.lim_y;
  g.ux = rx < -cam.lim_x ? -cam.lim_x : (rx > cam.lim_x ? cam.lim_x : rx);
  g.uy = ry < -cam.lim_y ? -cam.lim_y : (ry > cam.lim_y ? cam.lim_y : ry);
  // J = [[fx/z, 0, -fx*ux/z], [0, fy/z, -fy*uy/z]] (INRIA's -fx*tx/z^2 with tx = z*ux).
  const T J[2][3] = {{cam.fx / z, 0, -cam.fx * g.ux / z}, {0, cam.fy / z, -cam.fy * g.uy / z}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      g.Tm[i][j] = J[i][0] * cam.R[0][j] + J[i][1] * cam.R[1][j] + J[i][2] * cam.R[2][j];
  T TS[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      TS[i][j] = g.Tm[i][0] * g.Sigma[0][j] + g.Tm[i][1] * g.Sigma[1][j] +
                 g.Tm[i][2] * g.Sigma[2][j];
  g.a = TS[0][0] * g.Tm[0][0] + TS[0][1] * g.Tm[0][1] + TS[0][2] * g.Tm[0][2] + cam.eps2d;
  g.b = TS[0][0] * g.Tm[1][0] + TS[0][1] * g.Tm[1][1] + TS[0][2] * g.Tm[1][2];
  g.c = TS[1][0] * g.Tm[1][0] + TS[1][1] * g.Tm[1][1] + TS[1][2] * g.Tm[1][2] + cam.eps2d;
  g.det = g.a * g.c - g.b * g.b;
}

// 3 * sqrt(largest eigenvalue of [[a, b], [b, c]]), before the ceil. The discriminant is written
// as ((a - c)/2)^2 + b^2, which never goes negative (mid^2 - det can, by cancellation).
template <typename T>
TESSERA_HD inline T radius_before_ceil(T a, T b, T c) {
  const T half_diff = T(0.5) * (a - c);
  const T lambda = T(0.5) * (a + c) + hd_sqrt(half_diff * half_diff + b * b);
  return T(kSigmaRadius) * hd_sqrt(lambda);
}

// The largest radius in pixels a Gaussian is given. A degenerate splat (huge scale, or very close
// to the camera) whose 3-sigma radius is beyond it covers every tile anyway; clamping keeps the
// float-to-int32 conversion defined: beyond INT32_MAX the cast is undefined on the host (x86 gives
// INT32_MIN, a negative radius) and saturates on the device, so the two would disagree.
constexpr int32_t kMaxRadius = int32_t{1} << 30;

// Forward for one Gaussian. Writes means2d[2], depth, conic[3] (zeros when culled) and returns
// the radius in pixels (at most kMaxRadius), 0 when culled.
template <typename T>
TESSERA_HD inline int32_t project_forward(const T* mean,   // [3]
                                          const T* quat,   // [4]
                                          const T* scale,  // [3]
                                          const Camera<T>& cam,
                                          T* mean2d,       // [2]
                                          T* depth,        // [1]
                                          T* conic) {      // [3]
  Projected<T> g;
  to_camera(mean, cam, g.p);
  int32_t radius = 0;
  if (g.p[2] >= cam.near_plane && g.p[2] <= cam.far_plane) {
    project_covariance(quat, scale, cam, g);
    if (g.det > 0) {
      const T r_full = hd_ceil(radius_before_ceil(g.a, g.b, g.c));
      const T r = r_full < T(kMaxRadius) ? r_full : T(kMaxRadius);
      const T u = cam.fx * g.p[0] / g.p[2] + cam.cx;
      const T v = cam.fy * g.p[1] / g.p[2] + cam.cy;
      const bool off_image =
          u + r <= 0 || u - r >= cam.width || v + r <= 0 || v - r >= cam.height;
      if (!off_image) {
        radius = static_cast<int32_t>(r);
        mean2d[0] = u;
        mean2d[1] = v;
        depth[0] = g.p[2];
        conic[0] = g.c / g.det;
        conic[1] = -g.b / g.det;
        conic[2] = g.a / g.det;
        return radius;
      }
    }
  }
  mean2d[0] = mean2d[1] = 0;
  depth[0] = 0;
  conic[0] = conic[1] = conic[2] = 0;
  return 0;
}

// Backward for one Gaussian that forward kept (radius > 0): the gradients of means, quats and
// scales from those of means2d, depth and conic (any of which may be null, meaning zero).
template <typename T>
TESSERA_HD inline void project_backward(const T* mean,      // [3]
                                        const T* quat,      // [4]
                                        const T* scale,     // [3]
                                        const Camera<T>& cam,
                                        const T* v_mean2d,  // [2] or null
                                        const T* v_depth,   // [1] or null
                                        const T* v_conic,   // [3] or null
                                        T* v_mean,          // [3]
                                        T* v_quat,          // [4]
                                        T* v_scale) {       // [3]
  Projected<T> g;
  to_camera(mean, cam, g.p);
  project_covariance(quat, scale, cam, g);
  const T x = g.p[0], y = g.p[1], z = g.p[2];
  T v_p[3] = {0, 0, 0};  // dL/d(camera-space mean)

  // means2d: u = fx x / z + cx, v = fy y / z + cy;  depth = z.
  if (v_mean2d) {
    const T vu = v_mean2d[0], vv = v_mean2d[1];
    v_p[0] += vu * cam.fx / z;
    v_p[1] += vv * cam.fy / z;
    v_p[2] -= (vu * cam.fx * x + vv * cam.fy * y) / (z * z);
  }
  if (v_depth) v_p[2] += v_depth[0];

  // conic = [c, -b, a] / det, det = a c - b^2: gradient with respect to (a, b, c), where b
  // stands for both off-diagonal entries.
  T va = 0, vb = 0, vc = 0;
  if (v_conic) {
    const T vA = v_conic[0], vB = v_conic[1], vC = v_conic[2];
    const T a = g.a, b = g.b, c = g.c;
    const T inv_det2 = 1 / (g.det * g.det);
    va = (-c * c * vA + b * c * vB - b * b * vC) * inv_det2;
    vb = (2 * b * c * vA - (a * c + b * b) * vB + 2 * a * b * vC) * inv_det2;
    vc = (-b * b * vA + a * b * vB - a * a * vC) * inv_det2;
  }
  // cov2d = Tm Sigma Tm^T as <G, cov2d> with G = [[va, vb/2], [vb/2, vc]] symmetric:
  //   dL/dSigma = Tm^T G Tm,   dL/dTm = 2 G Tm Sigma.
  const T G[2][2] = {{va, T(0.5) * vb}, {T(0.5) * vb, vc}};
  T GT[2][3];  // G Tm
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) GT[i][j] = G[i][0] * g.Tm[0][j] + G[i][1] * g.Tm[1][j];
  T v_Sigma[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) v_Sigma[i][j] = g.Tm[0][i] * GT[0][j] + g.Tm[1][i] * GT[1][j];
  T v_T[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      v_T[i][j] = 2 * (GT[i][0] * g.Sigma[0][j] + GT[i][1] * g.Sigma[1][j] +
                       GT[i][2] * g.Sigma[2][j]);
  // Tm = J W: dL/dJ = dL/dTm W^T.
  T v_J[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      v_J[i][j] = v_T[i][0] * cam.R[j][0] + v_T[i][1] * cam.R[j][1] + v_T[i][2] * cam.R[j][2];
  // J00 = fx/z, J11 = fy/z, J02 = -fx ux/z, J12 = -fy uy/z with ux = clamp(x/z): inside the
  // clamp dux/dx = 1/z and dux/dz = -x/z^2, outside both are 0.
  const T z2 = z * z;
  v_p[2] -= (v_J[0][0] * cam.fx + v_J[1][1] * cam.fy) / z2;
  if (g.in_x) {
    v_p[0] -= v_J[0][2] * cam.fx / z2;
    v_p[2] += v_J[0][2] * cam.fx * (x / z + g.ux) / z2;
  } else {
    v_p[2] += v_J[0][2] * cam.fx * g.ux / z2;
  }
  if (g.in_y) {
    v_p[1] -= v_J[1][2] * cam.fy / z2;
    v_p[2] += v_J[1][2] * cam.fy * (y / z + g.uy) / z2;
  } else {
    v_p[2] += v_J[1][2] * cam.fy * g.uy / z2;
  }
  // p = W mean + t.
  for (int j = 0; j < 3; ++j)
    v_mean[j] = cam.R[0][j] * v_p[0] + cam.R[1][j] * v_p[1] + cam.R[2][j] * v_p[2];

  // Sigma = M M^T (dL/dSigma symmetric): dL/dM = 2 dL/dSigma M;  M = R diag(s).
  T v_R[3][3];
  for (int j = 0; j < 3; ++j) v_scale[j] = 0;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      const T v_M = 2 * (v_Sigma[i][0] * g.M[0][j] + v_Sigma[i][1] * g.M[1][j] +
                         v_Sigma[i][2] * g.M[2][j]);
      v_R[i][j] = v_M * scale[j];
      v_scale[j] += v_M * g.R[i][j];
    }
  }
  // R(q) for the unit q = (w, x, y, z): the partial derivatives of its nine entries.
  const T w = g.q[0], qx = g.q[1], qy = g.q[2], qz = g.q[3];
  T v_q[4];
  v_q[0] = 2 * (-qz * v_R[0][1] + qy * v_R[0][2] + qz * v_R[1][0] - qx * v_R[1][2] -
                qy * v_R[2][0] + qx * v_R[2][1]);
  v_q[1] = 2 * (qy * v_R[0][1] + qz * v_R[0][2] + qy * v_R[1][0] - 2 * qx * v_R[1][1] -
                w * v_R[1][2] + qz * v_R[2][0] + w * v_R[2][1] - 2 * qx * v_R[2][2]);
  v_q[2] = 2 * (-2 * qy * v_R[0][0] + qx * v_R[0][1] + w * v_R[0][2] + qx * v_R[1][0] +
                qz * v_R[1][2] - w * v_R[2][0] + qz * v_R[2][1] - 2 * qy * v_R[2][2]);
  v_q[3] = 2 * (-2 * qz * v_R[0][0] - w * v_R[0][1] + qx * v_R[0][2] + w * v_R[1][0] -
                2 * qz * v_R[1][1] + qy * v_R[1][2] + qx * v_R[2][0] + qy * v_R[2][1]);
  // q = quat / |quat|: dL/dquat = (v_q - q (q . v_q)) / |quat|.
  const T q_dot = w * v_q[0] + qx * v_q[1] + qy * v_q[2] + qz * v_q[3];
  for (int i = 0; i < 4; ++i) v_quat[i] = (v_q[i] - g.q[i] * q_dot) / g.qnorm;
}

}  // namespace tessera::kernels::projection_math
