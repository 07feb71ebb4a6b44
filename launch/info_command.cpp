// `tessera info FILE.h5`: a readable summary of a Tessera file: a tessera-scene dataset (cameras
// per split, image sizes, intrinsics, bounds, alpha, points) or a snapshot (step, model, what
// its model family describes, config).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "distributed/errors.h"
#include "framework/data/h5.h"
#include "framework/data/scene.h"
#include "framework/family.h"
#include "framework/snapshot.h"
#include "launch/cli_output.h"
#include "launch/commands.h"
#include "models/builtin.h"

namespace tessera::launch {

namespace {

// Distinct image sizes listed one by one; beyond this the rest are counted together.
constexpr size_t kListedSizes = 8;

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string range(double low, double high) {
  return low == high ? number(low) : number(low) + " .. " + number(high);
}

std::string file_size(const std::string& path) {
  const uint64_t bytes = std::filesystem::file_size(path);
  return human_bytes(bytes) + (bytes >= 1024 ? " (" + std::to_string(bytes) + " bytes)" : "");
}

// The file's format attribute; exit code 2 for any HDF5 file that is not a Tessera file.
std::string check_format(const std::string& path) {
  const data::h5::Id file = data::h5::open_file_read_only(path);
  if (!data::h5::has_attribute(file.get(), "format"))
    throw UserError(path + ": not a Tessera file (HDF5, but no root attribute 'format')");
  const auto format = data::h5::read_string_attribute(file.get(), "format");
  if (!format) throw UserError(path + ": not a Tessera file (root attribute 'format' is not a string)");
  if (*format != data::kSceneFormat && *format != kSnapshotFormat)
    throw UserError(path + ": not a Tessera file (root attribute format = \"" + *format + "\")");
  return *format;
}

void print_snapshot(const std::string& path, std::ostream& out) {
  const SnapshotReader reader(path);
  const SnapshotMeta& m = reader.meta();
  auto line = [&](const char* label, const std::string& value) {
    out << "  " << label << std::string(14 - std::string(label).size(), ' ') << value << "\n";
  };
  out << path << ": " << kSnapshotFormat << " version " << kSnapshotVersion << "\n";
  line("step:", std::to_string(m.step));
  line("model:", m.model);
  FamilyRegistry families;
  models::register_builtin_families(families);
  if (families.contains(m.model)) {
    const FamilyInfo& family = families.get(m.model, path);
    if (family.describe_snapshot)
      for (const auto& [label, value] : family.describe_snapshot(reader)) line(label.c_str(), value);
  }
  line("world size:", std::to_string(m.world_size) + " rank(s) wrote it");
  line("written by:", m.tessera_version.empty() ? "(not recorded)" : "tessera " + m.tessera_version);
  line("dataset:", "fingerprint " + m.dataset_fingerprint);
  line("file size:", file_size(path));
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

void print_summary(const data::SceneReader& scene, std::ostream& out) {
  const auto& cameras = scene.cameras();
  const auto& meta = scene.meta();
  auto line = [&](const char* label, const std::string& value) {
    out << "  " << label << std::string(14 - std::string(label).size(), ' ') << value << "\n";
  };
  out << scene.path() << ": " << data::kSceneFormat << " version " << scene.version() << "\n";
  line("source:", meta.source.empty() ? "(not recorded)" : meta.source);
  line("file size:", file_size(scene.path()));

  std::string splits;
  for (data::Split split : {data::Split::Train, data::Split::Val, data::Split::Test})
    splits += std::string(splits.empty() ? "" : ", ") + data::to_string(split) + " " +
              std::to_string(scene.indices(split).size());
  line("cameras:", std::to_string(cameras.size()) + " (" + splits + ")");

  std::map<std::pair<int32_t, int32_t>, size_t> sizes;  // (width, height) -> count
  for (const auto& c : cameras) ++sizes[{c.width, c.height}];
  if (sizes.size() == 1) {
    const auto& [wh, count] = *sizes.begin();
    line("image size:", std::to_string(wh.first) + "x" + std::to_string(wh.second) +
                            " (all cameras; " +
                            (scene.uniform_size() ? "one [C, H, W, 3] dataset)"
                                                  : "per-image datasets)"));
  } else {
    std::vector<std::pair<size_t, std::pair<int32_t, int32_t>>> by_count;
    for (const auto& [wh, count] : sizes) by_count.push_back({count, wh});
    std::sort(by_count.begin(), by_count.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    std::string listed;
    size_t rest = 0;
    for (size_t i = 0; i < by_count.size(); ++i) {
      const auto& [count, wh] = by_count[i];
      if (i < kListedSizes)
        listed += (i ? ", " : "") + std::to_string(wh.first) + "x" + std::to_string(wh.second) +
                  " (" + std::to_string(count) + ")";
      else
        rest += count;
    }
    if (rest > 0) listed += ", others (" + std::to_string(rest) + ")";
    line("image sizes:", std::to_string(sizes.size()) + " distinct: " + listed +
                             (scene.uniform_size() ? "" : "; per-image datasets"));
  }

  double fx_lo = cameras[0].fx, fx_hi = fx_lo, fy_lo = cameras[0].fy, fy_hi = fy_lo;
  size_t distorted = 0;
  for (const auto& c : cameras) {
    fx_lo = std::min(fx_lo, c.fx), fx_hi = std::max(fx_hi, c.fx);
    fy_lo = std::min(fy_lo, c.fy), fy_hi = std::max(fy_hi, c.fy);
    if (c.k1 != 0 || c.k2 != 0 || c.p1 != 0 || c.p2 != 0) ++distorted;
  }
  line("fx:", range(fx_lo, fx_hi) + " px");
  line("fy:", range(fy_lo, fy_hi) + " px");
  line("distortion:", distorted == 0 ? "none"
                                     : "present (" + std::to_string(distorted) + " of " +
                                           std::to_string(cameras.size()) + " cameras)");
  const auto& b = meta.scene_bounds;
  line("scene bounds:", "[" + number(b[0]) + ", " + number(b[1]) + ", " + number(b[2]) + "] .. [" +
                            number(b[3]) + ", " + number(b[4]) + ", " + number(b[5]) + "]");
  const auto& e = meta.scene_extent;
  if (meta.unbounded())
    line("scene extent:", "[" + number(e[0]) + ", " + number(e[1]) + ", " + number(e[2]) + "] .. [" +
                              number(e[3]) + ", " + number(e[4]) + ", " + number(e[5]) +
                              "] (unbounded: backgrounds beyond the bounds)");
  if (meta.capture_scale != 1.0 || meta.capture_offset != std::array<double, 3>{0, 0, 0})
    line("normalized:", "world = " + number(meta.capture_scale) + " * capture + (" +
                            number(meta.capture_offset[0]) + ", " + number(meta.capture_offset[1]) +
                            ", " + number(meta.capture_offset[2]) + ")");
  line("near / far:", number(meta.near) + " / " + number(meta.far));
  line("background:", "(" + number(meta.background[0]) + ", " + number(meta.background[1]) +
                          ", " + number(meta.background[2]) + ")");
  line("alpha:", scene.has_alpha() ? "yes" : "no");
  // From the open reader: opening the file again would check its whole seal again, a far larger
  // read than the points.
  line("points:", scene.has_points() ? std::to_string(scene.read_points_xyz().size(0)) : "none");
}

}  // namespace

Command add_info_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "info", "Print a summary of a Tessera file: a tessera-scene dataset (cameras per split, "
              "image sizes, intrinsics, bounds, near/far, alpha, points, size on disk) or a "
              "snapshot (step, model, world size, parameter counts, checksums, config)");
  sub->add_option("file", *path, "The .h5 file to describe (a dataset or a snapshot)")
      ->required();
  return {sub, [path] {
            if (check_format(*path) == kSnapshotFormat) {
              print_snapshot(*path, std::cout);
              return kExitOk;
            }
            const data::SceneReader scene(*path);
            print_summary(scene, std::cout);
            return kExitOk;
          }};
}

}  // namespace tessera::launch
