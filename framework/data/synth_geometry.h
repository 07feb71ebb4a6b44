// Exact ray-primitive geometry for `tessera synth`: vectors, rigid frames, closed-form ray
// intersections (sphere, box, oriented box, torus), signed distances and a bracketed root solver.
#pragma once

#include <array>
#include <cmath>

namespace tessera::data::synth {

struct Vec3 {
  double x = 0, y = 0, z = 0;
};

inline Vec3 operator+(const Vec3& a, const Vec3& b) { return {a.x + b.x, a.y + b.y, a.z + b.z}; }
inline Vec3 operator-(const Vec3& a, const Vec3& b) { return {a.x - b.x, a.y - b.y, a.z - b.z}; }
inline Vec3 operator-(const Vec3& a) { return {-a.x, -a.y, -a.z}; }
inline Vec3 operator*(const Vec3& a, double s) { return {a.x * s, a.y * s, a.z * s}; }
inline Vec3 operator*(double s, const Vec3& a) { return a * s; }
inline Vec3 mul(const Vec3& a, const Vec3& b) { return {a.x * b.x, a.y * b.y, a.z * b.z}; }
inline double dot(const Vec3& a, const Vec3& b) { return a.x * b.x + a.y * b.y + a.z * b.z; }
inline Vec3 cross(const Vec3& a, const Vec3& b) {
  return {a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x};
}
inline double length(const Vec3& a) { return std::sqrt(dot(a, a)); }
inline Vec3 normalize(const Vec3& a) { return a * (1.0 / length(a)); }

// A ray o + t d; `direction` has unit length, so t is the Euclidean distance from the origin.
struct Ray {
  Vec3 origin;
  Vec3 direction;
  Vec3 at(double t) const { return origin + direction * t; }
};

// A rigid placement: local = R^T (world - center), world = R local + center. `rotation` is
// row-major and orthonormal; its columns are the local axes expressed in world coordinates.
struct Frame {
  std::array<double, 9> rotation{1, 0, 0, 0, 1, 0, 0, 0, 1};
  Vec3 center;

  Vec3 to_local_dir(const Vec3& v) const;   // R^T v
  Vec3 to_world_dir(const Vec3& v) const;   // R v
  Vec3 to_local(const Vec3& p) const { return to_local_dir(p - center); }
  Vec3 to_world(const Vec3& p) const { return to_world_dir(p) + center; }
};

// The rotation by `angle` radians about the unit `axis` (right-handed), as a row-major matrix.
std::array<double, 9> axis_angle_rotation(const Vec3& axis, double angle);

// The nearest intersection with t in (t_min, t_max): distance along the ray and the outward unit
// normal (world coordinates) of the surface there.
struct Intersection {
  double t = 0;
  Vec3 normal;
};

// Each returns false when the ray misses the surface within (t_min, t_max). A ray starting
// inside a solid reports its exit point (normal still outward).
bool intersect_sphere(const Ray& ray, const Vec3& center, double radius, double t_min,
                      double t_max, Intersection* hit);
// Axis-aligned box [lo, hi] by the slab method.
bool intersect_box(const Ray& ray, const Vec3& lo, const Vec3& hi, double t_min, double t_max,
                   Intersection* hit);
// Box of `half_extents` in `frame` (the ray is taken into the frame, which preserves t).
bool intersect_oriented_box(const Ray& ray, const Frame& frame, const Vec3& half_extents,
                            double t_min, double t_max, Intersection* hit);
// Torus around the frame's local z axis, centered at the frame's origin: points at distance
// `minor` from the circle of radius `major` in the local xy plane. Solved exactly as a quartic in
// t (see solve_polynomial), then polished with one Newton step on the exact SDF.
bool intersect_torus(const Ray& ray, const Frame& frame, double major, double minor,
                     double t_min, double t_max, Intersection* hit);

// Exact signed distances (negative inside), in world coordinates.
double sdf_sphere(const Vec3& p, const Vec3& center, double radius);
double sdf_box(const Vec3& p, const Frame& frame, const Vec3& half_extents);
double sdf_torus(const Vec3& p, const Frame& frame, double major, double minor);

// The real roots in [lo, hi] of sum_k coeffs[k] x^k (degree 1..4, coeffs[degree] != 0), in
// ascending order; returns how many were written to `roots` (at most `degree`). Roots are isolated
// exactly: the roots of the derivative (found recursively) cut [lo, hi] into pieces on which the
// polynomial is monotone, and each piece with a sign change is solved by safeguarded
// Newton-bisection to full double precision. Double roots that only touch zero are not reported
// (a ray grazing a surface).
int solve_polynomial(const double* coeffs, int degree, double lo, double hi, double* roots);

}  // namespace tessera::data::synth
