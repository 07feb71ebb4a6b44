// SnapshotReader: opens a tessera-snapshot v2 file with the serial driver, checks its root
// attributes, and reads datasets whole (checksum verified) or by rows for re-sharding.
#include <algorithm>

#include "distributed/errors.h"
#include "framework/data/h5.h"
#include "framework/snapshot.h"
#include "framework/snapshot_layout.h"

namespace tessera {

namespace h5 = data::h5;
namespace layout = snapshot_layout;

namespace {

// Verification reads large datasets in blocks of about this many bytes, so that memory stays
// bounded whatever the snapshot's size.
constexpr int64_t kVerifyBlockBytes = int64_t{64} << 20;

herr_t collect_link(hid_t /*group*/, const char* name, const H5L_info_t* /*info*/, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

struct SnapshotReader::Impl {
  std::string path;
  h5::Id file;
  SnapshotMeta meta;
  int64_t dataset_count = 0;
  std::vector<std::string> datasets;  // every dataset path, sorted

  [[noreturn]] void fail(const std::string& what) const { throw UserError(path + ": " + what); }

  std::string required_string(const char* name) const {
    const std::optional<std::string> value = h5::read_string_attribute(file.get(), name);
    if (!value) missing(name, "a string");
    return *value;
  }

  int64_t required_int(const char* name) const {
    if (!h5::has_attribute(file.get(), name)) missing(name, "an integer");
    const h5::AttributeInfo info = h5::attribute_info(file.get(), name);
    if (info.type_class != H5T_INTEGER || info.count != 1) missing(name, "an integer");
    return h5::read_int_attribute(file.get(), name)[0];
  }

  [[noreturn]] void missing(const char* name, const char* what) const {
    fail(std::string("root attribute '") + name + "' is missing or not " + what +
         " (the file is damaged or was not written by Tessera)");
  }

  // The dataset `name`, or a UserError that says which snapshot lacks it.
  std::pair<std::string, h5::Id> open(const std::string& name) const {
    std::string key;
    try {
      key = layout::checked_name(name);
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
    if (!std::binary_search(datasets.begin(), datasets.end(), key))
      fail("has no dataset \"" + key + "\" (it holds " + std::to_string(datasets.size()) +
           " datasets; was it written by another model or config?)");
    return {key, h5::open_dataset(file.get(), key)};
  }

  torch::ScalarType dtype_of(const std::string& key, hid_t dataset) const {
    const std::optional<torch::ScalarType> dtype = layout::dataset_dtype(dataset);
    if (!dtype)
      fail("dataset \"" + key + "\" holds " + h5::describe_type(dataset) +
           ", which snapshots never store (the file is damaged or was not written by Tessera)");
    return *dtype;
  }

  uint64_t checksum_of(const std::string& key, hid_t dataset) const {
    const std::optional<uint64_t> value = h5::read_uint64_attribute(dataset, layout::kChecksumAttr);
    if (!value) fail("dataset \"" + key + "\" has no checksum attribute (the file is damaged)");
    return *value;
  }

  // Rows [start, start + count) (the whole scalar when the dataset has no dimensions), as stored
  // (bool as uint8). Read failures become UserError naming the dataset.
  torch::Tensor read_stored(const std::string& key, hid_t dataset, torch::ScalarType dtype,
                            const std::vector<hsize_t>& dims, int64_t start, int64_t count) const {
    std::vector<int64_t> shape(dims.begin(), dims.end());
    if (!shape.empty()) shape[0] = count;
    const torch::ScalarType stored = dtype == torch::kBool ? torch::kUInt8 : dtype;
    torch::Tensor out = torch::empty(shape, torch::TensorOptions().dtype(stored));
    if (out.numel() == 0) return out;
    const h5::Type type = *layout::stored_type(dtype);
    h5::ErrorCapture capture;
    try {
      if (dims.empty()) {
        h5::read(dataset, type, out.data_ptr());
      } else {
        std::vector<hsize_t> offset(dims.size(), 0), counts = dims;
        offset[0] = static_cast<hsize_t>(start);
        counts[0] = static_cast<hsize_t>(count);
        h5::read_block(dataset, type, offset, counts, out.data_ptr());
      }
    } catch (const std::exception& e) {
      fail("cannot read dataset \"" + key + "\" (the file is damaged or truncated): " +
           (capture.cause().empty() ? std::string(e.what()) : capture.cause()));
    }
    return out;
  }

  // "" when the dataset's bytes match its checksum, read in blocks of bounded size.
  std::string verify_dataset(const std::string& key) const {
    const h5::Id dataset = h5::open_dataset(file.get(), key);
    const torch::ScalarType dtype = dtype_of(key, dataset.get());
    const uint64_t stored = checksum_of(key, dataset.get());
    const std::vector<hsize_t> dims = h5::dims(dataset.get());
    const int64_t rows = dims.empty() ? 1 : static_cast<int64_t>(dims[0]);
    int64_t row_bytes = static_cast<int64_t>(c10::elementSize(dtype));
    for (size_t d = 1; d < dims.size(); ++d) row_bytes *= static_cast<int64_t>(dims[d]);
    const int64_t block = std::max<int64_t>(1, kVerifyBlockBytes / std::max<int64_t>(row_bytes, 1));
    uint64_t sum = 0;
    for (int64_t start = 0; start < rows; start += block) {
      const int64_t count = std::min(block, rows - start);
      const torch::Tensor part = read_stored(key, dataset.get(), dtype, dims, start, count);
      sum += checksum_partial(part.data_ptr(), part.nbytes(),
                                       static_cast<uint64_t>(start * row_bytes));
    }
    const uint64_t computed = checksum_finish(sum, static_cast<uint64_t>(rows * row_bytes));
    if (computed == stored) return "";
    return "dataset \"" + key + "\" is damaged: its checksum is " + hex(computed) +
           ", the file recorded " + hex(stored);
  }
};

SnapshotReader::SnapshotReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& r = *impl_;
  r.path = path;
  r.file = h5::open_file_read_only(path);
  h5::QuietErrors quiet;
  try {
    const hid_t root = r.file.get();
    const std::optional<std::string> format = h5::read_string_attribute(root, layout::kFormatAttr);
    if (!format)
      r.fail(std::string("not a tessera-snapshot file (no root attribute 'format'); snapshots are "
                         "the step-NNNNNNNN.h5 files in a run's snapshots/ folder"));
    if (*format != kSnapshotFormat)
      r.fail("not a tessera-snapshot file (its format is \"" + *format +
             "\"); snapshots are the step-NNNNNNNN.h5 files in a run's snapshots/ folder");
    const int64_t version = r.required_int(layout::kVersionAttr);
    if (version != kSnapshotVersion)
      r.fail("written as tessera-snapshot version " + std::to_string(version) +
             ", this build reads version " + std::to_string(kSnapshotVersion) +
             (version > kSnapshotVersion ? "; update Tessera" : "; the file is damaged"));
    const std::string checksum_kind = r.required_string(layout::kChecksumKindAttr);
    if (checksum_kind != layout::kChecksumKind)
      r.fail("unknown checksum algorithm \"" + checksum_kind + "\" (this build knows \"" +
             layout::kChecksumKind + "\")");
    r.meta.step = r.required_int(layout::kStepAttr);
    r.meta.model = r.required_string(layout::kModelAttr);
    r.meta.config_toml = r.required_string(layout::kConfigAttr);
    r.meta.world_size = static_cast<int>(r.required_int(layout::kWorldSizeAttr));
    r.meta.dataset_fingerprint = r.required_string(layout::kFingerprintAttr);
    r.meta.tessera_version = r.required_string(layout::kTesseraVersionAttr);
    const std::optional<uint64_t> meta_checksum =
        h5::read_uint64_attribute(root, layout::kMetaChecksumAttr);
    if (!meta_checksum) r.missing(layout::kMetaChecksumAttr, "an unsigned 64-bit integer");
    if (*meta_checksum != layout::meta_checksum(r.meta))
      r.fail("its root attributes (step, model, config, ...) are damaged: their checksum does not "
             "match");
    r.dataset_count = r.required_int(layout::kDatasetCountAttr);

    std::vector<std::string> links;
    H5_CHECK(H5Lvisit(root, H5_INDEX_NAME, H5_ITER_INC, collect_link, &links));
    for (const std::string& link : links)
      if (h5::kind_of(root, link) == h5::Kind::Dataset) r.datasets.push_back(link);
    std::sort(r.datasets.begin(), r.datasets.end());
  } catch (const UserError&) {
    throw;
  } catch (const std::runtime_error& e) {
    // HDF5 opened the file but could not read its attributes or links: damaged past the superblock.
    r.fail(std::string("cannot read its metadata (the file is damaged): ") + e.what());
  }
}

SnapshotReader::~SnapshotReader() = default;
SnapshotReader::SnapshotReader(SnapshotReader&&) noexcept = default;
SnapshotReader& SnapshotReader::operator=(SnapshotReader&&) noexcept = default;

const std::string& SnapshotReader::path() const { return impl_->path; }
const SnapshotMeta& SnapshotReader::meta() const { return impl_->meta; }

std::vector<std::string> SnapshotReader::names(const std::string& group) const {
  std::string prefix = group;
  while (!prefix.empty() && prefix.front() == '/') prefix.erase(prefix.begin());
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (!prefix.empty()) prefix += '/';
  std::vector<std::string> result;
  for (const std::string& name : impl_->datasets)
    if (name.compare(0, prefix.size(), prefix) == 0) result.push_back(name.substr(prefix.size()));
  return result;
}

bool SnapshotReader::has(const std::string& name) const {
  try {
    const std::string key = layout::checked_name(name);
    return std::binary_search(impl_->datasets.begin(), impl_->datasets.end(), key);
  } catch (const std::invalid_argument&) {
    return false;
  }
}

std::vector<int64_t> SnapshotReader::shape(const std::string& name) const {
  const auto [key, dataset] = impl_->open(name);
  const std::vector<hsize_t> dims = h5::dims(dataset.get());
  return std::vector<int64_t>(dims.begin(), dims.end());
}

torch::ScalarType SnapshotReader::dtype(const std::string& name) const {
  const auto [key, dataset] = impl_->open(name);
  return impl_->dtype_of(key, dataset.get());
}

uint64_t SnapshotReader::stored_checksum(const std::string& name) const {
  const auto [key, dataset] = impl_->open(name);
  return impl_->checksum_of(key, dataset.get());
}

torch::Tensor SnapshotReader::read(const std::string& name) const {
  const Impl& r = *impl_;
  const auto [key, dataset] = r.open(name);
  const torch::ScalarType dtype = r.dtype_of(key, dataset.get());
  const std::vector<hsize_t> dims = h5::dims(dataset.get());
  const int64_t rows = dims.empty() ? 1 : static_cast<int64_t>(dims[0]);
  torch::Tensor out = r.read_stored(key, dataset.get(), dtype, dims, 0, rows);
  const uint64_t computed = checksum(out.data_ptr(), out.nbytes());
  const uint64_t stored = r.checksum_of(key, dataset.get());
  if (computed != stored)
    r.fail("dataset \"" + key + "\" is damaged: its checksum is " + hex(computed) +
           ", the file recorded " + hex(stored) + " (use an older snapshot)");
  return dtype == torch::kBool ? out.to(torch::kBool) : out;
}

torch::Tensor SnapshotReader::read_rows(const std::string& name, int64_t start,
                                        int64_t count) const {
  const Impl& r = *impl_;
  const auto [key, dataset] = r.open(name);
  const torch::ScalarType dtype = r.dtype_of(key, dataset.get());
  const std::vector<hsize_t> dims = h5::dims(dataset.get());
  if (dims.empty()) r.fail("dataset \"" + key + "\" is a scalar; read it whole with read()");
  const int64_t rows = static_cast<int64_t>(dims[0]);
  if (start < 0 || count < 0 || start > rows || count > rows - start)
    r.fail("rows [" + std::to_string(start) + ", " + std::to_string(start + count) +
           ") of dataset \"" + key + "\" are out of range (it has " + std::to_string(rows) +
           " rows)");
  torch::Tensor out = r.read_stored(key, dataset.get(), dtype, dims, start, count);
  return dtype == torch::kBool ? out.to(torch::kBool) : out;
}

std::string SnapshotReader::verify() const {
  const Impl& r = *impl_;
  try {
    h5::QuietErrors quiet;
    if (static_cast<int64_t>(r.datasets.size()) != r.dataset_count)
      return r.path + ": holds " + std::to_string(r.datasets.size()) + " datasets, the writer " +
             "recorded " + std::to_string(r.dataset_count) + " (the file is damaged)";
    for (const std::string& key : r.datasets) {
      const std::string problem = r.verify_dataset(key);
      if (!problem.empty()) return r.path + ": " + problem;
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace tessera
