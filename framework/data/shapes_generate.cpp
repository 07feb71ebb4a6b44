// Procedural shapes for `tessera synth --preset shapes`: spheres, boxes, tori, capsules, cones and
// unions of two, with random size, pose and color, sampled uniformly by area on their exact
// surfaces (docs/synth.md, "Shapes").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "distributed/errors.h"
#include "framework/data/shapes.h"
#include "framework/data/synth.h"

namespace tessera::data::shapes {

namespace {

using Vec = std::array<double, 3>;
using synth::Rng;

constexpr double kPi = 3.14159265358979323846;
// Random streams of one shape (Rng's `stream`): its parameters, then its surface samples.
constexpr uint64_t kShapeStream = 0x5348415045ull;    // "SHAPE"
constexpr uint64_t kSampleStream = 0x53414d504cull;   // "SAMPL"
// Every primitive is scaled by this in a union, whose two parts sit at +-offset of its centre.
constexpr double kUnionScale = 0.75;
constexpr double kUnionOffsetMin = 0.15;
constexpr double kUnionOffsetMax = 0.35;
// The whole shape's centre moves at most this far from the origin (each axis).
constexpr double kMaxShift = 0.1;
// Colors stay away from pure black and white.
constexpr double kColorMin = 0.1;
constexpr double kColorMax = 0.9;
// A union whose parts leave no surface outside each other would loop forever; after this many
// candidate points per requested point the generator gives up (cannot happen with the sizes
// above: each part keeps at least the half turned away from the other).
constexpr int64_t kMaxTriesPerPoint = 1000;

Vec mul(const std::array<double, 9>& m, const Vec& v) {
  return {m[0] * v[0] + m[1] * v[1] + m[2] * v[2], m[3] * v[0] + m[4] * v[1] + m[5] * v[2],
          m[6] * v[0] + m[7] * v[1] + m[8] * v[2]};
}
Vec mul_transpose(const std::array<double, 9>& m, const Vec& v) {
  return {m[0] * v[0] + m[3] * v[1] + m[6] * v[2], m[1] * v[0] + m[4] * v[1] + m[7] * v[2],
          m[2] * v[0] + m[5] * v[1] + m[8] * v[2]};
}
double norm(const Vec& v) { return std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]); }

Vec random_unit(Rng& rng) {
  for (;;) {
    const Vec v{rng.normal(), rng.normal(), rng.normal()};
    const double n = norm(v);
    if (n > 1e-9) return {v[0] / n, v[1] / n, v[2] / n};
  }
}

// A uniformly random rotation (from a uniform unit quaternion), row-major.
std::array<double, 9> random_rotation(Rng& rng) {
  double q[4];
  double n = 0;
  do {
    for (double& x : q) x = rng.normal();
    n = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
  } while (n < 1e-9);
  const double w = q[0] / n, x = q[1] / n, y = q[2] / n, z = q[3] / n;
  return {1 - 2 * (y * y + z * z), 2 * (x * y - w * z),     2 * (x * z + w * y),
          2 * (x * y + w * z),     1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
          2 * (x * z - w * y),     2 * (y * z + w * x),     1 - 2 * (x * x + y * y)};
}

// A primitive of `kind` with random sizes (times `scale`), in its local frame.
Primitive random_primitive(Kind kind, double scale, Rng& rng) {
  Primitive p;
  p.kind = kind;
  switch (kind) {
    case Kind::Sphere: p.a = rng.uniform(0.25, 0.6); break;
    case Kind::Box:
      p.a = rng.uniform(0.15, 0.5);
      p.b = rng.uniform(0.15, 0.5);
      p.c = rng.uniform(0.15, 0.5);
      break;
    case Kind::Torus:
      p.a = rng.uniform(0.3, 0.5);
      p.b = rng.uniform(0.08, 0.2);
      break;
    case Kind::Capsule:
      p.a = rng.uniform(0.1, 0.3);
      p.b = rng.uniform(0.1, 0.4);
      break;
    case Kind::Cone:
      p.a = rng.uniform(0.2, 0.5);
      p.b = rng.uniform(0.3, 0.9);
      break;
    case Kind::Union: break;
  }
  p.a *= scale;
  p.b *= scale;
  p.c *= scale;
  p.rotation = random_rotation(rng);
  for (float& channel : p.color) channel = static_cast<float>(rng.uniform(kColorMin, kColorMax));
  return p;
}

struct Point {
  Vec position, normal;
};

// One point uniform by area on the primitive's surface, in its local frame.
Point sample_local(const Primitive& p, Rng& rng) {
  switch (p.kind) {
    case Kind::Sphere: {
      const Vec n = random_unit(rng);
      return {{p.a * n[0], p.a * n[1], p.a * n[2]}, n};
    }
    case Kind::Box: {
      const double h[3] = {p.a, p.b, p.c};
      const double face_area[3] = {h[1] * h[2], h[0] * h[2], h[0] * h[1]};  // per face, / 4
      double pick = rng.uniform(0, face_area[0] + face_area[1] + face_area[2]);
      int axis = 0;
      while (axis < 2 && pick >= face_area[axis]) pick -= face_area[axis++];
      const double sign = rng.uniform() < 0.5 ? -1.0 : 1.0;
      Vec x{}, n{};
      for (int k = 0; k < 3; ++k) x[k] = k == axis ? sign * h[k] : rng.uniform(-h[k], h[k]);
      n[axis] = sign;
      return {x, n};
    }
    case Kind::Torus: {
      // Area element (R + r cos v) du dv: v by rejection against its maximum R + r.
      double v = 0;
      do v = rng.uniform(0, 2 * kPi);
      while (rng.uniform() * (p.a + p.b) > p.a + p.b * std::cos(v));
      const double u = rng.uniform(0, 2 * kPi);
      const Vec n{std::cos(v) * std::cos(u), std::cos(v) * std::sin(u), std::sin(v)};
      const double ring = p.a + p.b * std::cos(v);
      return {{ring * std::cos(u), ring * std::sin(u), p.b * std::sin(v)}, n};
    }
    case Kind::Capsule: {
      const double cylinder = 2 * kPi * p.a * 2 * p.b, caps = 4 * kPi * p.a * p.a;
      if (rng.uniform(0, cylinder + caps) < cylinder) {
        const double t = rng.uniform(0, 2 * kPi);
        return {{p.a * std::cos(t), p.a * std::sin(t), rng.uniform(-p.b, p.b)},
                {std::cos(t), std::sin(t), 0}};
      }
      const Vec n = random_unit(rng);  // each hemisphere on its end of the segment
      const double end = n[2] >= 0 ? p.b : -p.b;
      return {{p.a * n[0], p.a * n[1], p.a * n[2] + end}, n};
    }
    case Kind::Cone: {
      const double slant = std::sqrt(p.a * p.a + p.b * p.b);
      const double lateral = kPi * p.a * slant, base = kPi * p.a * p.a;
      const double t = rng.uniform(0, 2 * kPi);
      const double s = std::sqrt(rng.uniform());  // area grows with the square of the distance
      if (rng.uniform(0, lateral + base) < lateral) {
        return {{s * p.a * std::cos(t), s * p.a * std::sin(t), p.b / 2 - s * p.b},
                {p.b * std::cos(t) / slant, p.b * std::sin(t) / slant, p.a / slant}};
      }
      return {{s * p.a * std::cos(t), s * p.a * std::sin(t), -p.b / 2}, {0, 0, -1}};
    }
    case Kind::Union: break;
  }
  throw std::logic_error("sample_local: not a primitive");
}

}  // namespace

Vec Primitive::to_local(const Vec& world) const {
  return mul_transpose(rotation, {world[0] - offset[0], world[1] - offset[1], world[2] - offset[2]});
}

bool Primitive::inside(const Vec& world) const {
  const Vec x = to_local(world);
  const double radial = std::hypot(x[0], x[1]);
  switch (kind) {
    case Kind::Sphere: return norm(x) < a;
    case Kind::Box: return std::abs(x[0]) < a && std::abs(x[1]) < b && std::abs(x[2]) < c;
    case Kind::Torus: return std::hypot(radial - a, x[2]) < b;
    case Kind::Capsule: return std::hypot(radial, x[2] - std::clamp(x[2], -b, b)) < a;
    case Kind::Cone: return x[2] > -b / 2 && x[2] < b / 2 && radial < a * (b / 2 - x[2]) / b;
    case Kind::Union: break;
  }
  return false;
}

double Primitive::surface_residual(const Vec& world) const {
  const Vec x = to_local(world);
  const double radial = std::hypot(x[0], x[1]);
  switch (kind) {
    case Kind::Sphere: return std::abs(norm(x) - a);
    case Kind::Box:
      return std::abs(std::max({std::abs(x[0]) - a, std::abs(x[1]) - b, std::abs(x[2]) - c}));
    case Kind::Torus: return std::abs(std::hypot(radial - a, x[2]) - b);
    case Kind::Capsule: return std::abs(std::hypot(radial, x[2] - std::clamp(x[2], -b, b)) - a);
    case Kind::Cone: {
      const double lateral = x[2] >= -b / 2 - 1e-9 && x[2] <= b / 2 + 1e-9
                                 ? std::abs(radial - a * (b / 2 - x[2]) / b)
                                 : INFINITY;
      const double base = radial <= a + 1e-9 ? std::abs(x[2] + b / 2) : INFINITY;
      return std::min(lateral, base);
    }
    case Kind::Union: break;
  }
  return INFINITY;
}

double Primitive::area() const {
  switch (kind) {
    case Kind::Sphere: return 4 * kPi * a * a;
    case Kind::Box: return 8 * (a * b + a * c + b * c);
    case Kind::Torus: return 4 * kPi * kPi * a * b;
    case Kind::Capsule: return 4 * kPi * a * b + 4 * kPi * a * a;
    case Kind::Cone: return kPi * a * std::sqrt(a * a + b * b) + kPi * a * a;
    case Kind::Union: break;
  }
  return 0;
}

void validate(const GenerateOptions& options) {
  if (options.count < kMinCount || options.count > kMaxCount)
    throw UserError("--count " + std::to_string(options.count) + " is out of range [" +
                    std::to_string(kMinCount) + ", " + std::to_string(kMaxCount) +
                    "] (at least one shape in each of train, val and test)");
  if (options.points < kMinPoints || options.points > kMaxPoints)
    throw UserError("--points " + std::to_string(options.points) + " is out of range [" +
                    std::to_string(kMinPoints) + ", " + std::to_string(kMaxPoints) + "]");
}

Shape make_shape(uint64_t seed, int64_t index) {
  Rng rng(seed ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull), kShapeStream);
  Shape shape;
  shape.kind = static_cast<Kind>(rng.index(kKinds));
  const Vec shift{rng.uniform(-kMaxShift, kMaxShift), rng.uniform(-kMaxShift, kMaxShift),
                  rng.uniform(-kMaxShift, kMaxShift)};
  if (shape.kind != Kind::Union) {
    shape.parts.push_back(random_primitive(shape.kind, 1.0, rng));
    shape.parts[0].offset = shift;
    return shape;
  }
  const Vec direction = random_unit(rng);
  const double distance = rng.uniform(kUnionOffsetMin, kUnionOffsetMax);
  for (const double side : {1.0, -1.0}) {
    Primitive part = random_primitive(static_cast<Kind>(rng.index(kKinds - 1)), kUnionScale, rng);
    for (int k = 0; k < 3; ++k) part.offset[k] = shift[k] + side * distance * direction[k];
    shape.parts.push_back(part);
  }
  return shape;
}

SurfaceSample sample_surface(const Shape& shape, int64_t points, uint64_t seed, int64_t index) {
  Rng rng(seed ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull), kSampleStream);
  SurfaceSample out;
  out.points = torch::empty({points, 3}, torch::kFloat32);
  out.normals = torch::empty({points, 3}, torch::kFloat32);
  out.colors = torch::empty({points, 3}, torch::kFloat32);
  float* xyz = out.points.data_ptr<float>();
  float* nrm = out.normals.data_ptr<float>();
  float* rgb = out.colors.data_ptr<float>();
  double total_area = 0;
  for (const Primitive& part : shape.parts) total_area += part.area();
  int64_t tries = 0;
  for (int64_t i = 0; i < points;) {
    if (++tries > kMaxTriesPerPoint * points)
      throw std::logic_error("sample_surface: the union's parts hide each other's surfaces");
    // A part by area, then a point on it; in a union, a point inside the other part is not on
    // the surface and is drawn again (rejection keeps the visible surface uniform by area).
    size_t k = 0;
    for (double pick = rng.uniform(0, total_area); k + 1 < shape.parts.size(); ++k) {
      if (pick < shape.parts[k].area()) break;
      pick -= shape.parts[k].area();
    }
    const Primitive& part = shape.parts[k];
    const Point local = sample_local(part, rng);
    const Vec world = mul(part.rotation, local.position);
    const Vec position{world[0] + part.offset[0], world[1] + part.offset[1],
                       world[2] + part.offset[2]};
    bool hidden = false;
    for (size_t other = 0; other < shape.parts.size(); ++other)
      hidden = hidden || (other != k && shape.parts[other].inside(position));
    if (hidden) continue;
    const Vec normal = mul(part.rotation, local.normal);
    for (int c = 0; c < 3; ++c) {
      xyz[3 * i + c] = static_cast<float>(position[c]);
      nrm[3 * i + c] = static_cast<float>(normal[c]);
      rgb[3 * i + c] = part.color[c];
    }
    ++i;
  }
  return out;
}

Split split_of_shape(int64_t index) {
  if (index % 10 == 0) return Split::Val;
  if (index % 10 == 5) return Split::Test;
  return Split::Train;
}

GenerateSummary write_generated_shapes(const GenerateOptions& options, const std::string& path,
                                       const std::function<void(int64_t, int64_t)>& progress) {
  validate(options);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = options.count, p = options.points;
  const torch::Tensor points = torch::empty({n, p, 3}, torch::kFloat32);
  const torch::Tensor normals = torch::empty({n, p, 3}, torch::kFloat32);
  const torch::Tensor colors = torch::empty({n, p, 3}, torch::kFloat32);
  const torch::Tensor split = torch::empty({n}, torch::kUInt8);
  const torch::Tensor kind = torch::empty({n}, torch::kInt32);
  GenerateSummary summary;
  for (int64_t i = 0; i < n; ++i) {
    const Shape shape = make_shape(options.seed, i);
    const SurfaceSample sample = sample_surface(shape, p, options.seed, i);
    points[i].copy_(sample.points);
    normals[i].copy_(sample.normals);
    colors[i].copy_(sample.colors);
    const Split s = split_of_shape(i);
    split[i] = static_cast<int>(s);
    kind[i] = static_cast<int>(shape.kind);
    ++summary.per_split[static_cast<size_t>(s)];
    if (progress) progress(i + 1, n);
  }
  const std::string source = "synth:shapes count=" + std::to_string(n) + " points=" +
                             std::to_string(p) + " seed=" + std::to_string(options.seed);
  write_shapes(path, points, normals, colors, split, kind, source);
  summary.file_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace tessera::data::shapes
