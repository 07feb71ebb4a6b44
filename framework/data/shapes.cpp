// tessera-shapes v2 files: write_shapes (atomic) and ShapesReader (checked layout, hyperslab reads
// of single shapes). The layout is docs/formats.md's "tessera-shapes v2".
#include "framework/data/shapes.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "distributed/errors.h"
#include "framework/data/fingerprint.h"
#include "framework/data/file_seal.h"
#include "framework/data/h5.h"

namespace tessera::data::shapes {

namespace {

constexpr const char* kFormatAttr = "format";
constexpr const char* kVersionAttr = "version";
constexpr const char* kSourceAttr = "source";
constexpr const char* kKindsAttr = "kinds";
constexpr const char* kPoints = "points";
constexpr const char* kNormals = "normals";
constexpr const char* kColors = "colors";
constexpr const char* kSplit = "split";
constexpr const char* kKind = "kind";
// Level 4 of 9, as the scenes: most of the size reduction for a fraction of level 9's time.
constexpr int kDeflateLevel = 4;

std::string kinds_text() {
  std::string out;
  for (int k = 0; k < kKinds; ++k) out += (k ? "," : "") + std::string(to_string(Kind(k)));
  return out;
}

std::string shape_text(const torch::Tensor& t) {
  if (!t.defined()) return "no tensor";
  std::ostringstream out;
  out << t.sizes() << " " << t.scalar_type();
  return out.str();
}

void require(const torch::Tensor& t, torch::ScalarType dtype, const std::vector<int64_t>& shape,
             const std::string& what, const std::string& path) {
  if (!t.defined() || t.scalar_type() != dtype || t.sizes().vec() != shape) {
    std::ostringstream want;
    want << c10::IntArrayRef(shape) << " " << dtype;
    throw UserError(path + ": cannot write shapes: " + what + " is " + shape_text(t) + ", must be " +
                    want.str());
  }
}

}  // namespace

const char* to_string(Kind kind) {
  switch (kind) {
    case Kind::Sphere: return "sphere";
    case Kind::Box: return "box";
    case Kind::Torus: return "torus";
    case Kind::Capsule: return "capsule";
    case Kind::Cone: return "cone";
    case Kind::Union: return "union";
  }
  return "?";
}

void write_shapes(const std::string& path, const torch::Tensor& points,
                  const torch::Tensor& normals, const torch::Tensor& colors,
                  const torch::Tensor& split, const torch::Tensor& kind, const std::string& source) {
  const int64_t n = points.defined() && points.dim() == 3 ? points.size(0) : -1;
  const int64_t p = points.defined() && points.dim() == 3 ? points.size(1) : -1;
  if (n < 1 || p < 1) throw UserError(path + ": cannot write shapes: points is " +
                                      shape_text(points) + ", must be [N, P, 3] float32, N, P >= 1");
  require(points, torch::kFloat32, {n, p, 3}, "points", path);
  require(normals, torch::kFloat32, {n, p, 3}, "normals", path);
  require(colors, torch::kFloat32, {n, p, 3}, "colors", path);
  require(split, torch::kUInt8, {n}, "split", path);
  require(kind, torch::kInt32, {n}, "kind", path);
  if (!torch::isfinite(points).all().item<bool>() || !torch::isfinite(normals).all().item<bool>())
    throw UserError(path + ": cannot write shapes: non-finite points or normals");
  if (!(colors.min().item<float>() >= 0.0f && colors.max().item<float>() <= 1.0f))
    throw UserError(path + ": cannot write shapes: colors outside [0, 1]");
  if (split.max().item<int>() > 2) throw UserError(path + ": cannot write shapes: split above 2");
  if (kind.min().item<int>() < 0 || kind.max().item<int>() >= kKinds)
    throw UserError(path + ": cannot write shapes: kind outside [0, " + std::to_string(kKinds) + ")");

  // Same directory as `path`, so that the final rename stays on one filesystem (atomic).
  const std::string temp = path + ".tmp-" + std::to_string(::getpid());
  try {
    h5::Id file = h5::create_file(temp);
    const hid_t root = file.get();
    h5::write_string_attribute(root, kFormatAttr, kShapesFormat);
    h5::write_int_attribute(root, kVersionAttr, kShapesVersion);
    h5::write_string_attribute(root, kSourceAttr, source);
    h5::write_string_attribute(root, kKindsAttr, kinds_text());
    const std::vector<hsize_t> dims{hsize_t(n), hsize_t(p), 3};
    const std::vector<hsize_t> chunk{1, hsize_t(p), 3};  // one shape per chunk: read() is per shape
    for (const auto& [name, tensor] : {std::pair<const char*, const torch::Tensor&>{kPoints, points},
                                       {kNormals, normals}, {kColors, colors}}) {
      h5::Id set = h5::create_dataset(root, name, h5::Type::F32, dims, chunk, kDeflateLevel);
      h5::write(set.get(), h5::Type::F32, tensor.contiguous().data_ptr<float>());
    }
    h5::Id split_set = h5::create_dataset(root, kSplit, h5::Type::U8, {hsize_t(n)});
    h5::write(split_set.get(), h5::Type::U8, split.contiguous().data_ptr<uint8_t>());
    h5::Id kind_set = h5::create_dataset(root, kKind, h5::Type::I32, {hsize_t(n)});
    h5::write(kind_set.get(), h5::Type::I32, kind.contiguous().data_ptr<int32_t>());
    split_set.close();
    kind_set.close();
    h5::flush(root);
    file.close();
    seal::seal(temp);
    std::filesystem::rename(temp, path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw;
  }
}

struct ShapesReader::Impl {
  h5::Id file;
  h5::Id points, normals, colors;
};

ShapesReader::ShapesReader(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  impl_->file = h5::open_file_read_only(path);
  const hid_t root = impl_->file.get();
  const auto format = h5::read_string_attribute(root, kFormatAttr);
  if (!format || *format != kShapesFormat)
    throw UserError(path + ": not a tessera-shapes file (its format attribute is " +
                    (format ? "'" + *format + "'" : std::string("missing")) +
                    "; make one with `tessera synth --preset shapes`)");
  const std::vector<int64_t> version = h5::has_attribute(root, kVersionAttr)
                                           ? h5::read_int_attribute(root, kVersionAttr)
                                           : std::vector<int64_t>{};
  if (version.size() != 1 || version[0] != kShapesVersion)
    throw UserError(path + ": tessera-shapes version " +
                    (version.size() == 1 ? std::to_string(version[0]) : std::string("missing")) +
                    " is not supported (this Tessera reads version " +
                    std::to_string(kShapesVersion) + ")");
  source_ = h5::read_string_attribute(root, kSourceAttr).value_or("");
  for (const char* name : {kPoints, kNormals, kColors, kSplit, kKind})
    if (h5::kind_of(root, name) != h5::Kind::Dataset)
      throw UserError(path + ": dataset /" + std::string(name) + " is missing");
  impl_->points = h5::open_dataset(root, kPoints);
  impl_->normals = h5::open_dataset(root, kNormals);
  impl_->colors = h5::open_dataset(root, kColors);
  const std::vector<hsize_t> dims = h5::dims(impl_->points.get());
  if (dims.size() != 3 || dims[2] != 3 || dims[0] < 1 || dims[1] < 1)
    throw UserError(path + ": dataset /points must be [N, P, 3] with N, P >= 1");
  count_ = static_cast<int64_t>(dims[0]);
  points_ = static_cast<int64_t>(dims[1]);
  for (const auto& [name, set] : {std::pair<const char*, hid_t>{kPoints, impl_->points.get()},
                                  {kNormals, impl_->normals.get()}, {kColors, impl_->colors.get()}}) {
    if (!h5::has_type(set, h5::Type::F32))
      throw UserError(path + ": dataset /" + std::string(name) + " is " + h5::describe_type(set) +
                      ", must be f32");
    if (h5::dims(set) != dims)
      throw UserError(path + ": dataset /" + std::string(name) + " must have the shape of /points");
  }
  const h5::Id split = h5::open_dataset(root, kSplit);
  const h5::Id kind = h5::open_dataset(root, kKind);
  if (!h5::has_type(split.get(), h5::Type::U8) || h5::dims(split.get()) != std::vector<hsize_t>{dims[0]})
    throw UserError(path + ": dataset /split must be u8 [N] (N = " + std::to_string(count_) + ")");
  if (!h5::has_type(kind.get(), h5::Type::I32) || h5::dims(kind.get()) != std::vector<hsize_t>{dims[0]})
    throw UserError(path + ": dataset /kind must be i32 [N] (N = " + std::to_string(count_) + ")");
  split_.resize(count_);
  kind_.resize(count_);
  h5::read(split.get(), h5::Type::U8, split_.data());
  h5::read(kind.get(), h5::Type::I32, kind_.data());
  for (int64_t i = 0; i < count_; ++i) {
    if (split_[i] > 2)
      throw UserError(path + ": /split[" + std::to_string(i) + "] = " + std::to_string(split_[i]) +
                      " (must be 0 train, 1 val or 2 test)");
    if (kind_[i] < 0 || kind_[i] >= kKinds)
      throw UserError(path + ": /kind[" + std::to_string(i) + "] = " + std::to_string(kind_[i]) +
                      " (must be in [0, " + std::to_string(kKinds) + "))");
  }
}

ShapesReader::~ShapesReader() = default;

Split ShapesReader::split(int64_t index) const { return static_cast<Split>(split_.at(index)); }
Kind ShapesReader::kind(int64_t index) const { return static_cast<Kind>(kind_.at(index)); }

std::vector<size_t> ShapesReader::indices(Split split) const {
  std::vector<size_t> out;
  for (int64_t i = 0; i < count_; ++i)
    if (split_[i] == static_cast<uint8_t>(split)) out.push_back(static_cast<size_t>(i));
  return out;
}

ShapeBatch ShapesReader::read(const std::vector<int64_t>& ids) const {
  const int64_t b = static_cast<int64_t>(ids.size());
  ShapeBatch batch;
  batch.points = torch::empty({b, points_, 3}, torch::kFloat32);
  batch.normals = torch::empty({b, points_, 3}, torch::kFloat32);
  batch.colors = torch::empty({b, points_, 3}, torch::kFloat32);
  const std::vector<hsize_t> count{1, hsize_t(points_), 3};
  for (int64_t i = 0; i < b; ++i) {
    if (ids[i] < 0 || ids[i] >= count_)
      throw std::out_of_range("ShapesReader::read: shape " + std::to_string(ids[i]) + " of " +
                              std::to_string(count_));
    const std::vector<hsize_t> start{hsize_t(ids[i]), 0, 0};
    h5::read_block(impl_->points.get(), h5::Type::F32, start, count, batch.points[i].data_ptr<float>());
    h5::read_block(impl_->normals.get(), h5::Type::F32, start, count, batch.normals[i].data_ptr<float>());
    h5::read_block(impl_->colors.get(), h5::Type::F32, start, count, batch.colors[i].data_ptr<float>());
  }
  return batch;
}

std::string ShapesReader::fingerprint() const {
  std::ostringstream text;
  text << kShapesFormat << " v" << kShapesVersion << " " << count_ << "x" << points_ << " "
       << source_ << " ";
  for (int64_t i = 0; i < count_; ++i) text << int(split_[i]) << kind_[i] << ',';
  return fingerprint_hex(text.str());
}

std::string ShapesReader::summary() const {
  return std::to_string(count_) + " shapes of " + std::to_string(points_) + " points";
}

std::string ShapesReader::format_version() const {
  return std::string(kShapesFormat) + " version " + std::to_string(kShapesVersion);
}

std::vector<InfoLine> ShapesReader::describe() const {
  std::vector<InfoLine> lines;
  lines.emplace_back("source:", source_.empty() ? "(not recorded)" : source_);
  lines.emplace_back("file size:", file_size_text(path_));
  std::string splits;
  for (Split split : {Split::Train, Split::Val, Split::Test})
    splits += std::string(splits.empty() ? "" : ", ") + to_string(split) + " " +
              std::to_string(indices(split).size());
  lines.emplace_back("shapes:", std::to_string(count_) + " (" + splits + ")");
  lines.emplace_back("points:", std::to_string(points_) + " per shape (position, normal, colour)");
  std::map<int32_t, int64_t> kinds;
  for (int32_t k : kind_) ++kinds[k];
  std::string listed;
  for (const auto& [k, n] : kinds)
    listed += (listed.empty() ? "" : ", ") + std::string(to_string(static_cast<Kind>(k))) + " " +
              std::to_string(n);
  lines.emplace_back("kinds:", listed.empty() ? "(none)" : listed);
  return lines;
}

}  // namespace tessera::data::shapes
