// tessera-shapes v2 (docs/formats.md): a dataset of 3D shapes, each P points sampled on its
// surface with their normals and colors, split into train/val/test by shape; the data of point
// cloud models (generative families). `tessera synth --preset shapes` writes one from procedural
// primitives whose surfaces are known exactly (generate_shapes); ShapesReader reads any subset
// of shapes by hyperslab, so each rank reads only the shapes it trains on.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/data/dataset.h"

namespace tessera::data::shapes {

constexpr const char* kShapesFormat = "tessera-shapes";
// 2: sealed (framework/data/file_seal.h); version 1 files had no seal and are refused by it.
constexpr int kShapesVersion = 2;

// The kinds of /kind, in this order (also the root attribute `kinds`).
enum class Kind : int32_t { Sphere = 0, Box = 1, Torus = 2, Capsule = 3, Cone = 4, Union = 5 };
constexpr int kKinds = 6;
const char* to_string(Kind kind);

// ---- Generation -------------------------------------------------------------------------------

// Limits of `tessera synth --preset shapes`.
constexpr int64_t kDefaultCount = 1000;
constexpr int64_t kDefaultPoints = 2048;
constexpr int64_t kMinCount = 10;        // at least one shape in each split
constexpr int64_t kMaxCount = 10000000;
constexpr int64_t kMinPoints = 16;
constexpr int64_t kMaxPoints = 1 << 20;

struct GenerateOptions {
  int64_t count = kDefaultCount;    // shapes
  int64_t points = kDefaultPoints;  // points per shape
  uint64_t seed = 0;
};
// UserError naming the flag (--count, --points) when out of range.
void validate(const GenerateOptions& options);

// One primitive in its local frame (axis z), placed by `rotation` (row-major, local -> world) and
// `offset`: world = rotation * local + offset.
struct Primitive {
  Kind kind = Kind::Sphere;  // never Union
  // Sphere: a = radius. Box: a, b, c = half extents. Torus: a = ring radius, b = tube radius.
  // Capsule: a = radius, b = half length of the segment. Cone: a = base radius, b = height (base
  // at z = -b/2, apex at z = +b/2).
  double a = 0, b = 0, c = 0;
  std::array<double, 9> rotation{1, 0, 0, 0, 1, 0, 0, 0, 1};
  std::array<double, 3> offset{0, 0, 0};
  std::array<float, 3> color{0.5f, 0.5f, 0.5f};

  std::array<double, 3> to_local(const std::array<double, 3>& world) const;
  // Strictly inside the solid.
  bool inside(const std::array<double, 3>& world) const;
  // How far a point is from the surface (0 on it), for tests: exact distance for the sphere,
  // box face, torus and capsule; for the cone the residual of the lateral or the base equation.
  double surface_residual(const std::array<double, 3>& world) const;
  double area() const;
};

// A shape: one primitive, or two for a Union (each surface point outside the other solid).
struct Shape {
  Kind kind = Kind::Sphere;
  std::vector<Primitive> parts;
};

// Shape `index` of the set: a pure function of (seed, index). Sizes, pose and color are random;
// everything lies within the unit ball.
Shape make_shape(uint64_t seed, int64_t index);

// `points` points uniform by area on the surface of `shape`, their outward unit normals and
// colors, each [points, 3] float32. A pure function of (shape, points, seed, index).
struct SurfaceSample {
  torch::Tensor points, normals, colors;
};
SurfaceSample sample_surface(const Shape& shape, int64_t points, uint64_t seed, int64_t index);

// The split of shape `index`: index % 10 == 0 is val, index % 10 == 5 is test, else train.
Split split_of_shape(int64_t index);

struct GenerateSummary {
  std::array<int64_t, 3> per_split{0, 0, 0};  // train, val, test
  int64_t file_bytes = 0;
  double seconds = 0;
};
// Generates the set and writes it to `path` atomically (a temporary file renamed into place).
// `progress(done, total)` is called after each shape. UserError for bad options or an unwritable
// path.
GenerateSummary write_generated_shapes(const GenerateOptions& options, const std::string& path,
                                       const std::function<void(int64_t, int64_t)>& progress = {});

// ---- Files -----------------------------------------------------------------------------------

// Writes a tessera-shapes v2 file atomically from whole tensors: points, normals [N, P, 3] and
// colors [N, P, 3] float32 (colors in [0, 1]), split [N] uint8 (0 train, 1 val, 2 test), kind [N]
// int32. UserError for tensors of the wrong shape or type, or values out of range.
void write_shapes(const std::string& path, const torch::Tensor& points,
                  const torch::Tensor& normals, const torch::Tensor& colors,
                  const torch::Tensor& split, const torch::Tensor& kind, const std::string& source);

// The shapes of a batch, [B, P, 3] float32 each.
struct ShapeBatch {
  torch::Tensor points, normals, colors;
};

// Reads a tessera-shapes v2 file. The constructor reads the root attributes, /split and /kind and
// checks every dataset's type and shape (UserError "PATH: ..." naming what is wrong); the points
// are read only by read(), shape by shape (each shape is one chunk).
class ShapesReader : public Dataset {
 public:
  explicit ShapesReader(const std::string& path);
  ~ShapesReader() override;
  ShapesReader(const ShapesReader&) = delete;
  ShapesReader& operator=(const ShapesReader&) = delete;

  const std::string& path() const override { return path_; }
  int64_t count() const { return count_; }
  int64_t points_per_shape() const { return points_; }
  const std::string& source() const { return source_; }
  Split split(int64_t index) const;
  Kind kind(int64_t index) const;
  std::vector<size_t> indices(Split split) const override;  // shape indices, ascending
  // The shapes `ids` (any order, repeats allowed), in that order.
  ShapeBatch read(const std::vector<int64_t>& ids) const;
  // Of the format, sizes, source, splits and kinds (not the points: a file is generated whole).
  std::string fingerprint() const override;
  std::string summary() const override;  // "1000 shapes of 2048 points"
  std::string format_version() const override;
  // Source, file size, shapes per split, points per shape, shapes per kind.
  std::vector<InfoLine> describe() const override;
  const ShapesReader* as_shapes() const override { return this; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::string source_;
  int64_t count_ = 0;
  int64_t points_ = 0;
  std::vector<uint8_t> split_;
  std::vector<int32_t> kind_;
};

}  // namespace tessera::data::shapes
