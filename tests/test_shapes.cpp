// Tests of the tessera-shapes dataset (framework/data/shapes.h): procedural shapes sampled exactly
// on their surfaces (outward unit normals, uniform by area, unions showing only their visible
// surface), determinism, and the file's writer and reader (round trip, splits, bad input).
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "distributed/errors.h"
#include "framework/data/file_seal.h"
#include "framework/data/h5.h"
#include "framework/data/shapes.h"
#include "tests/test_util.h"

namespace tessera::data::shapes {
namespace {

namespace fs = std::filesystem;
using Vec = std::array<double, 3>;

constexpr uint64_t kSeed = 3;
// Points are float32: a point on a surface of size ~1 is off it by a few 1e-8.
constexpr double kOnSurface = 1e-5;
// A step along the normal that leaves (or enters) the solid, far above float rounding.
constexpr double kStep = 1e-5;

Vec at(const torch::Tensor& t, int64_t i) {
  const float* p = t.data_ptr<float>() + 3 * i;
  return {p[0], p[1], p[2]};
}

std::string temp_path(const std::string& name) {
  return (fs::path(::testing::TempDir()) / name).string();
}

// The part whose surface `p` lies on (smallest residual).
const Primitive& owner(const Shape& shape, const Vec& p) {
  const Primitive* best = &shape.parts[0];
  for (const Primitive& part : shape.parts)
    if (part.surface_residual(p) < best->surface_residual(p)) best = &part;
  return *best;
}

TEST(ShapesGenerate, PointsLieOnTheSurfaceWithOutwardUnitNormalsAndTheirPartsColor) {
  std::set<Kind> kinds;
  for (int64_t index = 0; index < 60; ++index) {
    const Shape shape = make_shape(kSeed, index);
    kinds.insert(shape.kind);
    ASSERT_EQ(shape.parts.size(), shape.kind == Kind::Union ? 2u : 1u);
    const SurfaceSample s = sample_surface(shape, 512, kSeed, index);
    for (int64_t i = 0; i < 512; ++i) {
      const Vec p = at(s.points, i), n = at(s.normals, i), c = at(s.colors, i);
      const Primitive& part = owner(shape, p);
      ASSERT_LT(part.surface_residual(p), kOnSurface) << to_string(shape.kind) << " " << index;
      ASSERT_NEAR(std::sqrt(n[0] * n[0] + n[1] * n[1] + n[2] * n[2]), 1.0, 1e-6);
      const Vec out{p[0] + kStep * n[0], p[1] + kStep * n[1], p[2] + kStep * n[2]};
      const Vec in{p[0] - kStep * n[0], p[1] - kStep * n[1], p[2] - kStep * n[2]};
      ASSERT_FALSE(part.inside(out)) << "normal points inward: " << to_string(part.kind);
      ASSERT_TRUE(part.inside(in)) << "normal points inward: " << to_string(part.kind);
      for (const Primitive& other : shape.parts)  // a union shows only its outer surface
        if (&other != &part) ASSERT_FALSE(other.inside(p)) << "hidden point of a union";
      for (int k = 0; k < 3; ++k) ASSERT_EQ(static_cast<float>(c[k]), part.color[k]);
      ASSERT_LE(std::sqrt(p[0] * p[0] + p[1] * p[1] + p[2] * p[2]), 1.0);  // the unit ball
    }
  }
  EXPECT_EQ(kinds.size(), static_cast<size_t>(kKinds)) << "60 shapes should show every kind";
}

// Uniform by area: the share of points on each piece of a surface is that piece's share of the
// area, within 5 standard deviations of a binomial count.
void expect_share(int64_t hits, int64_t total, double share, const std::string& what) {
  const double sigma = std::sqrt(total * share * (1 - share));
  EXPECT_NEAR(static_cast<double>(hits), total * share, 5 * sigma) << what;
}

TEST(ShapesGenerate, SamplesAreUniformByArea) {
  constexpr int64_t kPoints = 20000;
  int checked = 0;
  for (int64_t index = 0; index < 40; ++index) {
    const Shape shape = make_shape(kSeed, index);
    if (shape.kind == Kind::Union || shape.kind == Kind::Sphere) continue;
    const Primitive& part = shape.parts[0];
    const SurfaceSample s = sample_surface(shape, kPoints, kSeed, index);
    int64_t hits = 0;
    double share = 0;
    for (int64_t i = 0; i < kPoints; ++i) {
      const Vec x = part.to_local(at(s.points, i));
      const double radial = std::hypot(x[0], x[1]);
      switch (shape.kind) {
        case Kind::Box:  // the two faces across x
          hits += std::abs(std::abs(x[0]) - part.a) < kOnSurface;
          break;
        case Kind::Torus:  // the outer half of the tube
          hits += radial > part.a;
          break;
        case Kind::Capsule:  // the cylinder
          hits += std::abs(x[2]) < part.b;
          break;
        case Kind::Cone:  // the base
          hits += std::abs(x[2] + part.b / 2) < kOnSurface;
          break;
        default: break;
      }
    }
    const double pi = 3.14159265358979323846;
    switch (shape.kind) {
      case Kind::Box: share = part.b * part.c / (part.a * part.b + part.a * part.c + part.b * part.c); break;
      case Kind::Torus: share = (pi * part.a + 2 * part.b) / (2 * pi * part.a); break;
      case Kind::Capsule: share = part.b / (part.b + part.a); break;
      case Kind::Cone: share = part.a / (part.a + std::hypot(part.a, part.b)); break;
      default: break;
    }
    expect_share(hits, kPoints, share, std::string(to_string(shape.kind)) + " " + std::to_string(index));
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

TEST(ShapesGenerate, APureFunctionOfSeedAndIndex) {
  const SurfaceSample a = sample_surface(make_shape(kSeed, 7), 256, kSeed, 7);
  const SurfaceSample b = sample_surface(make_shape(kSeed, 7), 256, kSeed, 7);
  EXPECT_TRUE(torch::equal(a.points, b.points));
  EXPECT_TRUE(torch::equal(a.normals, b.normals));
  const SurfaceSample other_seed = sample_surface(make_shape(kSeed + 1, 7), 256, kSeed + 1, 7);
  const SurfaceSample other_index = sample_surface(make_shape(kSeed, 8), 256, kSeed, 8);
  EXPECT_FALSE(torch::equal(a.points, other_seed.points));
  EXPECT_FALSE(torch::equal(a.points, other_index.points));
}

TEST(ShapesGenerate, SplitsByShape) {
  EXPECT_EQ(split_of_shape(0), Split::Val);
  EXPECT_EQ(split_of_shape(5), Split::Test);
  EXPECT_EQ(split_of_shape(15), Split::Test);
  EXPECT_EQ(split_of_shape(1), Split::Train);
  EXPECT_EQ(split_of_shape(9), Split::Train);
  EXPECT_THROW(validate({9, 64, 0}), UserError);
  EXPECT_THROW(validate({10, 15, 0}), UserError);
  EXPECT_NO_THROW(validate({10, 16, 0}));
}

TEST(ShapesFile, RoundTripReadsAnySubsetByShape) {
  const std::string path = temp_path("shapes_roundtrip.h5");
  const GenerateSummary summary = write_generated_shapes({30, 64, kSeed}, path);
  EXPECT_EQ(summary.per_split, (std::array<int64_t, 3>{24, 3, 3}));
  const ShapesReader reader(path);
  EXPECT_EQ(reader.count(), 30);
  EXPECT_EQ(reader.points_per_shape(), 64);
  EXPECT_EQ(reader.indices(Split::Val), (std::vector<size_t>{0, 10, 20}));
  EXPECT_EQ(reader.indices(Split::Test), (std::vector<size_t>{5, 15, 25}));
  EXPECT_EQ(reader.summary(), "30 shapes of 64 points");
  EXPECT_EQ(reader.fingerprint().size(), 16u);
  EXPECT_EQ(reader.indices(Split::Train).size(), 24u);
  const ShapeBatch batch = reader.read({12, 3, 12});
  ASSERT_EQ(batch.points.sizes(), (std::vector<int64_t>{3, 64, 3}));
  for (const auto& [row, index] : {std::pair<int64_t, int64_t>{0, 12}, {1, 3}, {2, 12}}) {
    const Shape shape = make_shape(kSeed, index);
    const SurfaceSample want = sample_surface(shape, 64, kSeed, index);
    EXPECT_TRUE(torch::equal(batch.points[row], want.points)) << index;
    EXPECT_TRUE(torch::equal(batch.normals[row], want.normals)) << index;
    EXPECT_TRUE(torch::equal(batch.colors[row], want.colors)) << index;
    EXPECT_EQ(reader.kind(index), shape.kind);
  }
  EXPECT_THROW(reader.read({30}), std::out_of_range);
  // The fingerprint follows the data.
  const std::string other = temp_path("shapes_other.h5");
  write_generated_shapes({30, 64, kSeed + 1}, other);
  EXPECT_EQ(reader.fingerprint(), ShapesReader(path).fingerprint());
  EXPECT_NE(reader.fingerprint(), ShapesReader(other).fingerprint());
  fs::remove(path);
  fs::remove(other);
}

using test::error_of;

TEST(ShapesFile, BadInputIsNamedAndLeavesNothingBehind) {
  const std::string path = temp_path("shapes_bad.h5");
  const torch::Tensor points = torch::zeros({4, 8, 3});
  const torch::Tensor split = torch::zeros({4}, torch::kUInt8);
  const torch::Tensor kind = torch::zeros({4}, torch::kInt32);
  EXPECT_NE(error_of([&] {
              write_shapes(path, points, points, torch::zeros({4, 8, 2}), split, kind, "t");
            }).find("colors is [4, 8, 2] Float, must be [4, 8, 3] Float"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_shapes(path, points, points, points + 2, split, kind, "t");
            }).find("colors outside [0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_shapes(path, points, points, points, split, kind + 6, "t");
            }).find("kind outside [0, 6)"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THROW(write_shapes("/nonexistent/dir/x.h5", points, points, points, split, kind, "t"),
               UserError);

  // Not a shapes file; a file with a dataset of the wrong type.
  std::ofstream(path) << "not hdf5";
  EXPECT_NE(error_of([&] { ShapesReader r(path); }).find(path + ": 8 bytes: not a Tessera file"),
            std::string::npos);
  write_shapes(path, points, points, points, split, kind, "t");
  {
    h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    H5Ldelete(file.get(), "split", H5P_DEFAULT);
    h5::Id bad = h5::create_dataset(file.get(), "split", h5::Type::I32, {4});
    const int32_t zeros[4] = {0, 0, 0, 0};
    h5::write(bad.get(), h5::Type::I32, zeros);
  }
  // Edited with the HDF5 API: refused by the seal; sealed again, by the reader's own check.
  const std::string edited = error_of([&] { ShapesReader r(path); });
  EXPECT_EQ(edited.rfind(path + ": ", 0), 0u) << edited;
  EXPECT_NE(edited.find("its seal says"), std::string::npos) << edited;
  seal::seal(path);
  EXPECT_EQ(error_of([&] { ShapesReader r(path); }),
            path + ": dataset /split must be u8 [N] (N = 4)");
  {
    h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    H5Adelete(file.get(), "format");
    h5::write_string_attribute(file.get(), "format", "tessera-scene");
  }
  seal::seal(path);
  EXPECT_NE(error_of([&] { ShapesReader r(path); })
                .find("not a tessera-shapes file (its format attribute is 'tessera-scene'"),
            std::string::npos);
  fs::remove(path);
}

}  // namespace
}  // namespace tessera::data::shapes
