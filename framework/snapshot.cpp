// Snapshot files without the writer and reader classes: file names, the dataset checksum, the
// layout helpers, validation, finding the newest good snapshot and rotation (docs/formats.md).
#include "framework/snapshot.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "distributed/errors.h"
#include "framework/snapshot_layout.h"

namespace tessera {

namespace fs = std::filesystem;

// ---- File names ----

std::string snapshot_path(const std::string& dir, int64_t step) {
  if (step < 0) throw std::invalid_argument("snapshot_path: step " + std::to_string(step) + " < 0");
  char name[64];
  std::snprintf(name, sizeof(name), "step-%08lld.h5", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

std::optional<int64_t> snapshot_step(const std::string& path) {
  static const std::regex pattern(R"(step-([0-9]{1,18})\.h5)");
  std::smatch match;
  const std::string name = fs::path(path).filename().string();
  if (!std::regex_match(name, match, pattern)) return std::nullopt;
  return std::stoll(match[1].str());
}

std::string snapshot_param(const std::string& name) { return "params/" + name; }
std::string snapshot_optimizer(const std::string& param, const std::string& field) {
  return "optimizer/" + param + "/" + field;
}
std::string snapshot_state(const std::string& name) { return "state/" + name; }

// ---- Layout helpers ----

namespace snapshot_layout {

std::optional<data::h5::Type> stored_type(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return data::h5::Type::F32;
    case torch::kFloat64: return data::h5::Type::F64;
    case torch::kInt64: return data::h5::Type::I64;
    case torch::kInt32: return data::h5::Type::I32;
    case torch::kUInt8:
    case torch::kBool: return data::h5::Type::U8;
    default: return std::nullopt;
  }
}

std::string dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return "float32";
    case torch::kFloat64: return "float64";
    case torch::kInt64: return "int64";
    case torch::kInt32: return "int32";
    case torch::kUInt8: return "uint8";
    case torch::kBool: return "bool";
    default: return c10::toString(dtype);
  }
}

std::optional<torch::ScalarType> dataset_dtype(hid_t dataset) {
  namespace h5 = data::h5;
  const std::optional<std::string> declared = h5::read_string_attribute(dataset, kDtypeAttr);
  for (const torch::ScalarType dtype :
       {torch::kFloat32, torch::kFloat64, torch::kInt64, torch::kInt32, torch::kUInt8,
        torch::kBool}) {
    if (declared && *declared != dtype_name(dtype)) continue;
    if (!declared && dtype == torch::kBool) continue;  // bool is only known by its attribute
    if (h5::has_type(dataset, *stored_type(dtype))) return dtype;
  }
  return std::nullopt;
}

std::string checked_name(const std::string& name) {
  const std::string path = !name.empty() && name[0] == '/' ? name.substr(1) : name;
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument("snapshot dataset name \"" + name + "\" " + why);
  };
  if (path.empty()) bad("is empty");
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(begin, end - begin);
    if (part.empty()) bad("has an empty component (\"//\" or a trailing '/')");
    if (part == "." || part == "..") bad("has a \".\" or \"..\" component");
    for (const char c : part)
      if (c < 0x20 || c > 0x7e) bad("has a character outside printable ASCII");
    begin = end + 1;
  }
  return path;
}

uint64_t meta_checksum(const SnapshotMeta& meta) {
  // Each field with its length, so that no two different metas serialize alike.
  std::string text;
  for (const std::string& field :
       {std::to_string(meta.step), meta.model, meta.config_toml, meta.dataset_fingerprint,
        meta.tessera_version, std::to_string(meta.world_size)})
    text += std::to_string(field.size()) + ":" + field + ";";
  return checksum(text.data(), text.size());
}

}  // namespace snapshot_layout

// ---- Validation, latest, rotation ----

std::string validate_snapshot(const std::string& path) {
  try {
    const SnapshotReader reader(path);
    return reader.verify();
  } catch (const std::exception& e) {
    return e.what();
  }
}

namespace {
// step-*.h5 files of `dir`, newest first; none when `dir` does not exist.
std::vector<std::pair<int64_t, std::string>> snapshots_newest_first(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return found;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (!entry.is_regular_file(error)) continue;
    const std::string path = entry.path().string();
    if (const std::optional<int64_t> step = snapshot_step(path)) found.emplace_back(*step, path);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  return found;
}
}  // namespace

std::optional<std::string> find_latest_snapshot(
    const std::string& dir, const std::function<void(const std::string&)>& warn) {
  for (const auto& [step, path] : snapshots_newest_first(dir)) {
    const std::string problem = validate_snapshot(path);
    if (problem.empty()) return path;
    if (warn)
      warn("skipping snapshot " + path + " (step " + std::to_string(step) +
           "), it cannot be used: " + problem);
  }
  return std::nullopt;
}

std::vector<std::string> rotate_snapshots(const std::string& dir, int keep) {
  if (keep < 0) throw std::invalid_argument("rotate_snapshots: keep " + std::to_string(keep) + " < 0");
  std::vector<std::string> removed;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return removed;
  // Temporary files of writers that died: step-*.h5.tmp.
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string path = entry.path().string();
    if (path.size() > 4 && path.compare(path.size() - 4, 4, ".tmp") == 0 &&
        snapshot_step(path.substr(0, path.size() - 4)) && fs::remove(path, error))
      removed.push_back(path);
  }
  if (keep == 0) return removed;
  const auto snapshots = snapshots_newest_first(dir);
  for (size_t i = std::max<size_t>(static_cast<size_t>(keep), 1); i < snapshots.size(); ++i)
    if (fs::remove(snapshots[i].second, error)) removed.push_back(snapshots[i].second);
  return removed;
}

}  // namespace tessera
