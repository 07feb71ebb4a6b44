// Exact ray-primitive intersections and signed distances for the `tessera synth` ray caster.
// Closed forms only (the torus is an exactly isolated quartic); nothing here is shared with models.
#include "framework/data/synth_geometry.h"

#include <algorithm>
#include <limits>

namespace tessera::data::synth {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Newton-bisection stops after this many steps; a double bracket halves to nothing in ~1100,
// but Newton converges in under 10 on these well-scaled polynomials, so this is a safety net.
constexpr int kMaxRootIterations = 200;
// Relative step below which a root counts as converged: a few ulps of double precision.
constexpr double kRootRelTolerance = 4 * std::numeric_limits<double>::epsilon();

double eval_poly(const double* c, int degree, double x, double* derivative) {
  double value = c[degree], slope = 0;
  for (int k = degree - 1; k >= 0; --k) {
    slope = slope * x + value;
    value = value * x + c[k];
  }
  if (derivative) *derivative = slope;
  return value;
}

// The root of a monotone polynomial piece on [a, b], where f(a) and f(b) have opposite signs.
double refine_root(const double* c, int degree, double a, double b, double fa) {
  double x = 0.5 * (a + b);
  for (int i = 0; i < kMaxRootIterations; ++i) {
    double slope = 0;
    const double f = eval_poly(c, degree, x, &slope);
    if (f == 0) return x;
    if ((f < 0) == (fa < 0)) {
      a = x;
    } else {
      b = x;
    }
    double next = slope != 0 ? x - f / slope : 0.5 * (a + b);
    if (!(next > a && next < b)) next = 0.5 * (a + b);  // Newton left the bracket: bisect
    const double scale = std::max({std::abs(x), std::abs(next), 1e-300});
    if (std::abs(next - x) <= kRootRelTolerance * scale || b - a <= kRootRelTolerance * scale)
      return next;
    x = next;
  }
  return x;
}

Vec3 torus_normal_local(const Vec3& p, double major) {
  const double q = std::sqrt(p.x * p.x + p.y * p.y);
  if (q == 0) return {0, 0, p.z >= 0 ? 1.0 : -1.0};  // unreachable for major > minor
  return normalize(Vec3{p.x - major * p.x / q, p.y - major * p.y / q, p.z});
}

double sdf_torus_local(const Vec3& p, double major, double minor) {
  const double q = std::sqrt(p.x * p.x + p.y * p.y) - major;
  return std::sqrt(q * q + p.z * p.z) - minor;
}

}  // namespace

Vec3 Frame::to_local_dir(const Vec3& v) const {
  const auto& r = rotation;
  return {r[0] * v.x + r[3] * v.y + r[6] * v.z, r[1] * v.x + r[4] * v.y + r[7] * v.z,
          r[2] * v.x + r[5] * v.y + r[8] * v.z};
}

Vec3 Frame::to_world_dir(const Vec3& v) const {
  const auto& r = rotation;
  return {r[0] * v.x + r[1] * v.y + r[2] * v.z, r[3] * v.x + r[4] * v.y + r[5] * v.z,
          r[6] * v.x + r[7] * v.y + r[8] * v.z};
}

std::array<double, 9> axis_angle_rotation(const Vec3& axis, double angle) {
  const Vec3 u = normalize(axis);
  const double c = std::cos(angle), s = std::sin(angle), t = 1 - c;
  return {t * u.x * u.x + c,       t * u.x * u.y - s * u.z, t * u.x * u.z + s * u.y,
          t * u.x * u.y + s * u.z, t * u.y * u.y + c,       t * u.y * u.z - s * u.x,
          t * u.x * u.z - s * u.y, t * u.y * u.z + s * u.x, t * u.z * u.z + c};
}

int solve_polynomial(const double* coeffs, int degree, double lo, double hi, double* roots) {
  if (!(lo <= hi)) return 0;
  if (degree == 1) {
    const double x = -coeffs[0] / coeffs[1];
    if (x >= lo && x <= hi) {
      roots[0] = x;
      return 1;
    }
    return 0;
  }
  // Critical points split [lo, hi] into monotone pieces, each holding at most one root.
  std::array<double, 4> derivative{};
  for (int k = 0; k < degree; ++k) derivative[k] = (k + 1) * coeffs[k + 1];
  std::array<double, 6> cuts{};
  int n_cuts = 0;
  cuts[n_cuts++] = lo;
  n_cuts += solve_polynomial(derivative.data(), degree - 1, lo, hi, cuts.data() + 1);
  cuts[n_cuts++] = hi;

  int found = 0;
  double fa = eval_poly(coeffs, degree, cuts[0], nullptr);
  if (fa == 0) roots[found++] = cuts[0];
  for (int i = 0; i + 1 < n_cuts; ++i) {
    const double a = cuts[i], b = cuts[i + 1];
    const double fb = eval_poly(coeffs, degree, b, nullptr);
    if (fb == 0) {
      if (found == 0 || roots[found - 1] != b) roots[found++] = b;
    } else if (fa != 0 && (fa < 0) != (fb < 0) && b > a) {
      roots[found++] = refine_root(coeffs, degree, a, b, fa);
    }
    fa = fb;
    if (found == degree) break;
  }
  return found;
}

bool intersect_sphere(const Ray& ray, const Vec3& center, double radius, double t_min,
                      double t_max, Intersection* hit) {
  // Distance from the center to the closest point of the line, computed without cancellation.
  const Vec3 oc = ray.origin - center;
  const double b = dot(oc, ray.direction);
  const Vec3 closest = oc - ray.direction * b;
  const double disc = radius * radius - dot(closest, closest);
  if (disc < 0) return false;
  const double s = std::sqrt(disc);
  double t = -b - s;
  if (!(t > t_min)) t = -b + s;
  if (!(t > t_min) || !(t < t_max)) return false;
  hit->t = t;
  hit->normal = (ray.at(t) - center) * (1.0 / radius);
  return true;
}

bool intersect_box(const Ray& ray, const Vec3& lo, const Vec3& hi, double t_min, double t_max,
                   Intersection* hit) {
  const double o[3] = {ray.origin.x, ray.origin.y, ray.origin.z};
  const double d[3] = {ray.direction.x, ray.direction.y, ray.direction.z};
  const double l[3] = {lo.x, lo.y, lo.z};
  const double h[3] = {hi.x, hi.y, hi.z};
  double t_near = -kInf, t_far = kInf;
  int near_axis = -1, far_axis = -1;
  for (int i = 0; i < 3; ++i) {
    if (d[i] == 0) {
      if (o[i] < l[i] || o[i] > h[i]) return false;  // parallel to the slab and outside it
      continue;
    }
    double t0 = (l[i] - o[i]) / d[i], t1 = (h[i] - o[i]) / d[i];
    if (t0 > t1) std::swap(t0, t1);
    if (t0 > t_near) t_near = t0, near_axis = i;
    if (t1 < t_far) t_far = t1, far_axis = i;
  }
  if (t_near > t_far) return false;
  double t;
  int axis;
  double sign;  // the outward normal's sign along `axis`
  if (t_near > t_min && near_axis >= 0) {
    t = t_near, axis = near_axis, sign = d[axis] > 0 ? -1.0 : 1.0;  // entering: faces the ray
  } else if (t_far > t_min && far_axis >= 0) {
    t = t_far, axis = far_axis, sign = d[axis] > 0 ? 1.0 : -1.0;  // leaving from inside
  } else {
    return false;
  }
  if (!(t < t_max)) return false;
  double n[3] = {0, 0, 0};
  n[axis] = sign;
  hit->t = t;
  hit->normal = {n[0], n[1], n[2]};
  return true;
}

bool intersect_oriented_box(const Ray& ray, const Frame& frame, const Vec3& half_extents,
                            double t_min, double t_max, Intersection* hit) {
  const Ray local{frame.to_local(ray.origin), frame.to_local_dir(ray.direction)};
  if (!intersect_box(local, -half_extents, half_extents, t_min, t_max, hit)) return false;
  hit->normal = frame.to_world_dir(hit->normal);
  return true;
}

bool intersect_torus(const Ray& ray, const Frame& frame, double major, double minor,
                     double t_min, double t_max, Intersection* hit) {
  const Vec3 o = frame.to_local(ray.origin);
  const Vec3 d = frame.to_local_dir(ray.direction);
  // Bounding sphere first: it rejects most rays and bounds the quartic's search interval.
  const double bound = major + minor;
  const double tc = -dot(o, d);  // closest approach to the center
  const Vec3 o2 = o + d * tc;    // re-origin there so the coefficients stay small (no cancellation)
  const double disc = bound * bound - dot(o2, o2);
  if (disc < 0) return false;
  const double half_chord = std::sqrt(disc);
  double lo = std::max(-half_chord, t_min - tc), hi = std::min(half_chord, t_max - tc);
  // The surface also lies within the slab |z| <= minor: narrow the interval to it.
  if (d.z != 0) {
    double z0 = (-minor - o2.z) / d.z, z1 = (minor - o2.z) / d.z;
    if (z0 > z1) std::swap(z0, z1);
    lo = std::max(lo, z0), hi = std::min(hi, z1);
  } else if (std::abs(o2.z) > minor) {
    return false;
  }
  if (!(lo <= hi)) return false;

  // |p|^2 + R^2 - r^2)^2 = 4 R^2 (px^2 + py^2) with p = o2 + s d, |d| = 1.
  const double r2 = major * major;
  const double k = dot(o2, o2) + r2 - minor * minor;
  const double f = dot(o2, d);
  const double a = d.x * d.x + d.y * d.y;
  const double b = o2.x * d.x + o2.y * d.y;
  const double c = o2.x * o2.x + o2.y * o2.y;
  const double coeffs[5] = {k * k - 4 * r2 * c, 4 * f * k - 8 * r2 * b,
                            4 * f * f + 2 * k - 4 * r2 * a, 4 * f, 1.0};
  double roots[4];
  const int n = solve_polynomial(coeffs, 4, lo, hi, roots);
  for (int i = 0; i < n; ++i) {
    double t = roots[i] + tc;
    if (!(t > t_min) || !(t < t_max)) continue;
    // One Newton step on the exact SDF, kept only when it moves closer to the surface.
    const Vec3 p = o + d * t;
    const double dist = sdf_torus_local(p, major, minor);
    const double slope = dot(torus_normal_local(p, major), d);
    if (slope != 0) {
      const double t2 = t - dist / slope;
      if (std::abs(sdf_torus_local(o + d * t2, major, minor)) < std::abs(dist) && t2 > t_min &&
          t2 < t_max)
        t = t2;
    }
    hit->t = t;
    hit->normal = frame.to_world_dir(torus_normal_local(o + d * t, major));
    return true;
  }
  return false;
}

double sdf_sphere(const Vec3& p, const Vec3& center, double radius) {
  return length(p - center) - radius;
}

double sdf_box(const Vec3& p, const Frame& frame, const Vec3& half_extents) {
  const Vec3 l = frame.to_local(p);
  const Vec3 q{std::abs(l.x) - half_extents.x, std::abs(l.y) - half_extents.y,
               std::abs(l.z) - half_extents.z};
  const Vec3 outside{std::max(q.x, 0.0), std::max(q.y, 0.0), std::max(q.z, 0.0)};
  return length(outside) + std::min(std::max({q.x, q.y, q.z}), 0.0);
}

double sdf_torus(const Vec3& p, const Frame& frame, double major, double minor) {
  return sdf_torus_local(frame.to_local(p), major, minor);
}

}  // namespace tessera::data::synth
