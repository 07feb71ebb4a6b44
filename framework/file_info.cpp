// `tessera info` (file_info.h): snapshots described by the framework and their family, datasets
// by their readers.
#include "framework/file_info.h"

#include <filesystem>
#include <sstream>

#include "distributed/errors.h"
#include "framework/data/dataset.h"
#include "framework/data/h5.h"
#include "framework/data/scene.h"
#include "framework/data/shapes.h"
#include "framework/session.h"
#include "framework/snapshot.h"

namespace tessera {

namespace {

// One "  label:       value" line, values aligned.
void print_line(std::ostream& out, const std::string& label, const std::string& value) {
  out << "  " << label << std::string(label.size() < 14 ? 14 - label.size() : 1, ' ') << value
      << "\n";
}

// The file's format attribute; exit code 2 for any HDF5 file that is not a Tessera file.
std::string check_format(const std::string& path) {
  const data::h5::Id file = data::h5::open_file_read_only(path);
  if (!data::h5::has_attribute(file.get(), "format"))
    throw UserError(path + ": not a Tessera file (HDF5, but no root attribute 'format')");
  const auto format = data::h5::read_string_attribute(file.get(), "format");
  if (!format) throw UserError(path + ": not a Tessera file (root attribute 'format' is not a string)");
  if (*format != data::kSceneFormat && *format != data::shapes::kShapesFormat &&
      *format != kSnapshotFormat)
    throw UserError(path + ": not a Tessera file (root attribute format = \"" + *format + "\")");
  return *format;
}

void print_snapshot(const std::string& path, const FamilyRegistry& families, std::ostream& out) {
  const SnapshotReader reader(path);
  const SnapshotMeta& m = reader.meta();
  auto line = [&](const std::string& label, const std::string& value) {
    print_line(out, label, value);
  };
  out << path << ": " << kSnapshotFormat << " version " << kSnapshotVersion << "\n";
  line("step:", std::to_string(m.step));
  line("model:", m.model);
  if (families.contains(m.model)) {
    const FamilyInfo& family = families.get(m.model, path);
    if (family.describe_snapshot)
      for (const auto& [label, value] : family.describe_snapshot(reader)) line(label, value);
  }
  line("world size:", std::to_string(m.world_size) + " rank(s) wrote it");
  line("written by:", m.tessera_version.empty() ? "(not recorded)" : "tessera " + m.tessera_version);
  line("dataset:", "fingerprint " + m.dataset_fingerprint);
  line("file size:", data::file_size_text(path));
  const std::string problem = reader.verify();
  line("checksums:", problem.empty() ? "all datasets verified" : "DAMAGED: " + problem);
  int64_t total = 0;
  const auto params = reader.names("params");
  out << "  parameters:\n";
  for (const std::string& name : params) {
    int64_t count = 1;
    std::string shape;
    for (int64_t d : reader.shape("params/" + name)) {
      count *= d;
      shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    }
    total += count;
    out << "    " << name << " [" << shape << "] " << count << "\n";
  }
  line("total:", std::to_string(total) + " parameters in " + std::to_string(params.size()) + " tensors");
  std::string state;
  for (const std::string& name : reader.names("state"))
    state += (state.empty() ? "" : ", ") + name;
  line("state:", state.empty() ? "(none)" : state);
  out << "  config:\n";
  std::istringstream config(m.config_toml);
  for (std::string text; std::getline(config, text);) out << "    " << text << "\n";
  if (!problem.empty())
    throw UserError(path + ": damaged snapshot: " + problem);
}

// A dataset's own description (data::Dataset::describe), in info's layout.
void print_dataset(const data::Dataset& dataset, std::ostream& out) {
  out << dataset.path() << ": " << dataset.format_version() << "\n";
  for (const auto& [label, value] : dataset.describe()) print_line(out, label, value);
}

}  // namespace

void describe_file(const std::string& path, const FamilyRegistry& families, std::ostream& out) {
  if (std::filesystem::is_directory(path)) {
    print_snapshot(snapshot_argument(path), families, out);
    return;
  }
  if (check_format(path) == kSnapshotFormat) {
    print_snapshot(path, families, out);
    return;
  }
  print_dataset(*data::open_any_dataset(path), out);
}

}  // namespace tessera
