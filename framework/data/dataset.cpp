// Opening any Tessera dataset by its format, and what `tessera info` says of each kind
// (dataset.h).
#include "framework/data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "distributed/errors.h"
#include "framework/data/h5.h"
#include "framework/data/scene.h"
#include "framework/data/shapes.h"
#include "framework/memory.h"

namespace tessera::data {

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

std::string box(const std::array<double, 6>& b) {
  return "[" + number(b[0]) + ", " + number(b[1]) + ", " + number(b[2]) + "] .. [" + number(b[3]) +
         ", " + number(b[4]) + ", " + number(b[5]) + "]";
}

}  // namespace

std::string file_size_text(const std::string& path) {
  const auto bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  return format_bytes(bytes) + (bytes >= 1024 ? " (" + std::to_string(bytes) + " bytes)" : "");
}

std::unique_ptr<Dataset> open_any_dataset(const std::string& path) {
  std::optional<std::string> format;
  {
    const h5::Id file = h5::open_file_read_only(path);
    if (!h5::has_attribute(file.get(), "format"))
      throw UserError(path + ": not a Tessera dataset (HDF5, but no root attribute 'format')");
    format = h5::read_string_attribute(file.get(), "format");
  }
  if (!format) throw UserError(path + ": not a Tessera dataset (root attribute 'format' is not a string)");
  if (*format == kSceneFormat) return std::make_unique<SceneReader>(path);
  if (*format == shapes::kShapesFormat) return std::make_unique<shapes::ShapesReader>(path);
  throw UserError(path + ": not a Tessera dataset (root attribute format = \"" + *format +
                  "\"; datasets are \"" + kSceneFormat + "\" or \"" + shapes::kShapesFormat + "\")");
}

std::string SceneReader::format_version() const {
  return std::string(kSceneFormat) + " version " + std::to_string(version());
}

std::vector<InfoLine> SceneReader::describe() const {
  const auto& cams = cameras();
  const SceneMeta& m = meta();
  std::vector<InfoLine> lines;
  lines.emplace_back("source:", m.source.empty() ? "(not recorded)" : m.source);
  lines.emplace_back("file size:", file_size_text(path()));
  std::string splits;
  for (Split split : {Split::Train, Split::Val, Split::Test})
    splits += std::string(splits.empty() ? "" : ", ") + to_string(split) + " " +
              std::to_string(indices(split).size());
  lines.emplace_back("cameras:", std::to_string(cams.size()) + " (" + splits + ")");

  std::map<std::pair<int32_t, int32_t>, size_t> sizes;  // (width, height) -> count
  for (const auto& c : cams) ++sizes[{c.width, c.height}];
  if (sizes.size() == 1) {
    const auto& wh = sizes.begin()->first;
    lines.emplace_back("image size:", std::to_string(wh.first) + "x" + std::to_string(wh.second) +
                                          " (all cameras; " +
                                          (uniform_size() ? "one [C, H, W, 3] dataset)"
                                                          : "per-image datasets)"));
  } else {
    std::vector<std::pair<size_t, std::pair<int32_t, int32_t>>> by_count;
    for (const auto& [wh, count] : sizes) by_count.push_back({count, wh});
    std::stable_sort(by_count.begin(), by_count.end(),
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
    lines.emplace_back("image sizes:", std::to_string(sizes.size()) + " distinct: " + listed +
                                           (uniform_size() ? "" : "; per-image datasets"));
  }

  double fx_lo = cams[0].fx, fx_hi = fx_lo, fy_lo = cams[0].fy, fy_hi = fy_lo;
  size_t distorted = 0;
  for (const auto& c : cams) {
    fx_lo = std::min(fx_lo, c.fx), fx_hi = std::max(fx_hi, c.fx);
    fy_lo = std::min(fy_lo, c.fy), fy_hi = std::max(fy_hi, c.fy);
    if (c.k1 != 0 || c.k2 != 0 || c.p1 != 0 || c.p2 != 0) ++distorted;
  }
  lines.emplace_back("fx:", range(fx_lo, fx_hi) + " px");
  lines.emplace_back("fy:", range(fy_lo, fy_hi) + " px");
  lines.emplace_back("distortion:", distorted == 0 ? "none"
                                                   : "present (" + std::to_string(distorted) +
                                                         " of " + std::to_string(cams.size()) +
                                                         " cameras)");
  lines.emplace_back("scene bounds:", box(m.scene_bounds));
  if (m.unbounded())
    lines.emplace_back("scene extent:",
                       box(m.scene_extent) + " (unbounded: backgrounds beyond the bounds)");
  if (m.capture_scale != 1.0 || m.capture_offset != std::array<double, 3>{0, 0, 0})
    lines.emplace_back("normalized:", "world = " + number(m.capture_scale) + " * capture + (" +
                                          number(m.capture_offset[0]) + ", " +
                                          number(m.capture_offset[1]) + ", " +
                                          number(m.capture_offset[2]) + ")");
  lines.emplace_back("near / far:", number(m.near) + " / " + number(m.far));
  lines.emplace_back("background:", "(" + number(m.background[0]) + ", " +
                                        number(m.background[1]) + ", " + number(m.background[2]) +
                                        ")");
  lines.emplace_back("alpha:", has_alpha() ? "yes" : "no");
  // From the open reader: opening the file again would check its whole seal again, a far larger
  // read than the points.
  lines.emplace_back("points:", has_points() ? std::to_string(read_points_xyz().size(0)) : "none");
  return lines;
}

}  // namespace tessera::data
