// The run report page (framework/report/run_report.h): the run's files gathered into one JSON
// object, embedded into the page template.
#include "framework/report/run_report.h"

#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <tuple>
#include <sstream>
#include <toml++/toml.h>
#include <vector>

#include "distributed/errors.h"
#include "framework/data/import.h"
#include "framework/data/whole_file.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string base64(const std::string& bytes) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (static_cast<uint8_t>(bytes[i + 1]) << 8) | static_cast<uint8_t>(bytes[i + 2]);
    out += digits[v >> 18];
    out += digits[(v >> 12) & 63];
    out += digits[(v >> 6) & 63];
    out += digits[v & 63];
  }
  if (i < bytes.size()) {
    const bool two = i + 1 < bytes.size();
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (two ? static_cast<uint8_t>(bytes[i + 1]) << 8 : 0);
    out += digits[v >> 18];
    out += digits[(v >> 12) & 63];
    out += two ? digits[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string png_uri(const fs::path& path) {
  return "data:image/png;base64," + base64(read_text(path));
}

// `count` of `n` indices spread evenly, always with the last (ascending).
std::vector<size_t> spread(size_t n, size_t count) {
  std::vector<size_t> picked;
  if (n == 0 || count == 0) return picked;
  if (count >= n) {
    for (size_t i = 0; i < n; ++i) picked.push_back(i);
    return picked;
  }
  for (size_t k = 0; k < count; ++k) {
    const size_t i = count == 1 ? n - 1 : (n - 1) * k / (count - 1);
    if (picked.empty() || picked.back() != i) picked.push_back(i);
  }
  return picked;
}

// The warnings and errors of the ranks' logs (RUN_DIR/logs/rank-R.log, in rank order): the
// newest `per_rank` of each rank (a log grows across resumes); `dropped` counts the older ones.
nlohmann::json log_warnings(const fs::path& logs, size_t per_rank, int64_t& dropped) {
  nlohmann::json out = nlohmann::json::array();
  dropped = 0;
  if (!fs::is_directory(logs)) return out;
  std::vector<std::pair<long long, fs::path>> files;
  const std::regex name(R"(rank-(\d+)\.log)");
  for (const auto& entry : fs::directory_iterator(logs)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, name)) files.emplace_back(std::stoll(m[1]), entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& [rank, file] : files) {
    std::ifstream in(file);
    std::string line;
    std::vector<std::string> found;
    while (std::getline(in, line))
      if (line.find("] [warning] ") != std::string::npos ||
          line.find("] [error] ") != std::string::npos ||
          line.find("] [critical] ") != std::string::npos)
        found.push_back(line);
    const size_t first = found.size() > per_rank ? found.size() - per_rank : 0;
    dropped += static_cast<int64_t>(first);
    for (size_t i = first; i < found.size(); ++i) out.push_back(found[i]);
  }
  return out;
}

}  // namespace

ReportSummary write_run_report(const ReportOptions& options) {
  const fs::path dir = options.run_dir;
  if (!fs::is_directory(dir))
    throw UserError(options.run_dir + " is not a folder; give the run's folder (run.out_dir)");
  const fs::path metrics_path = dir / "metrics.jsonl";
  if (!fs::is_regular_file(metrics_path))
    throw UserError(options.run_dir + " has no metrics.jsonl, so it is not a run folder: give "
                    "the run.out_dir of a `tessera train` run");
  ReportSummary summary;
  summary.path = options.out.empty() ? (dir / "report.html").string() : options.out;
  const fs::path out_path = summary.path;
  if (!out_path.parent_path().empty() && !fs::is_directory(out_path.parent_path()))
    throw UserError("cannot write " + summary.path + ": its folder does not exist");

  nlohmann::json data;
  data["run_dir"] = fs::absolute(dir).lexically_normal().string();
  data["name"] = fs::absolute(dir).lexically_normal().filename().string();
  {
    const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char stamp[64];
    std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
    data["generated"] = stamp;
  }

  // The records: steps in order; a resumed run's file holds each step once (trainer_run.h).
  nlohmann::json records = nlohmann::json::array();
  nlohmann::json run_summary;
  {
    std::ifstream in(metrics_path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        ++summary.skipped_lines;
        continue;
      }
      if (j.value("summary", false)) run_summary = j;
      else records.push_back(std::move(j));
    }
  }
  summary.records = static_cast<int64_t>(records.size());
  // A long run logged often (train.log_every = 1 over 100k steps) would make a page of tens of
  // MB that draws slowly: past max_records, every k-th record is kept, with every eval record
  // and the last.
  if (options.max_records > 0 && static_cast<int64_t>(records.size()) > options.max_records) {
    const size_t every = (records.size() + options.max_records - 1) / options.max_records;
    nlohmann::json kept = nlohmann::json::array();
    for (size_t i = 0; i < records.size(); ++i) {
      const bool eval = std::any_of(records[i].items().begin(), records[i].items().end(),
                                    [](const auto& item) { return item.key().rfind("eval_", 0) == 0; });
      if (i % every == 0 || eval || i + 1 == records.size()) kept.push_back(records[i]);
    }
    records = std::move(kept);
  }
  summary.records_shown = static_cast<int64_t>(records.size());
  data["records"] = records;
  data["records_logged"] = summary.records;
  data["summary"] = run_summary;

  // The resolved config (written at the start of each process of the run).
  const fs::path config_path = dir / "config.toml";
  if (fs::is_regular_file(config_path)) {
    const std::string text = read_text(config_path);
    data["config"] = text;
    try {
      const toml::table table = toml::parse(text);
      if (auto name = table["run"]["name"].value<std::string>()) data["name"] = *name;
      if (auto model = table["model"]["name"].value<std::string>()) data["model"] = *model;
    } catch (const toml::parse_error&) {
    }
  }

  const fs::path ranks_path = dir / "ranks.json";
  if (fs::is_regular_file(ranks_path)) {
    nlohmann::json ranks = nlohmann::json::parse(read_text(ranks_path), nullptr, false);
    if (!ranks.is_discarded() && ranks.is_object()) {
      summary.ranks = static_cast<int64_t>(ranks.value("ranks", nlohmann::json::array()).size());
      data["ranks"] = ranks;
    }
  }

  // Eval renders: renders/step-SSSSSSSS-view-VVV.png beside renders/target-view-VVV.png.
  std::map<int64_t, std::map<int64_t, fs::path>> renders;  // step -> view -> file
  std::map<int64_t, fs::path> targets;
  const fs::path render_dir = dir / "renders";
  if (fs::is_directory(render_dir)) {
    const std::regex render_name(R"(step-(\d+)-view-(\d+)\.png)");
    const std::regex target_name(R"(target-view-(\d+)\.png)");
    for (const auto& entry : fs::directory_iterator(render_dir)) {
      const std::string name = entry.path().filename().string();
      std::smatch m;
      if (std::regex_match(name, m, render_name))
        renders[std::stoll(m[1])][std::stoll(m[2])] = entry.path();
      else if (std::regex_match(name, m, target_name))
        targets[std::stoll(m[1])] = entry.path();
    }
  }
  std::vector<int64_t> steps;
  for (const auto& [step, views] : renders) steps.push_back(step);
  nlohmann::json evals = nlohmann::json::array();
  nlohmann::json target_uris = nlohmann::json::object();
  for (size_t i : spread(steps.size(), static_cast<size_t>(std::max<int64_t>(options.eval_steps, 0)))) {
    nlohmann::json views = nlohmann::json::array();
    for (const auto& [view, file] : renders[steps[i]]) {
      if (static_cast<int64_t>(views.size()) >= options.views) break;
      views.push_back({{"view", view}, {"render", png_uri(file)}});
      ++summary.images;
      const std::string key = std::to_string(view);
      if (!target_uris.contains(key) && targets.count(view)) {
        target_uris[key] = png_uri(targets[view]);
        ++summary.images;
      }
    }
    evals.push_back({{"step", steps[i]}, {"views", views}});
  }
  summary.eval_steps = static_cast<int64_t>(evals.size());
  data["evals"] = evals;
  data["targets"] = target_uris;

  // Samples of a generative family: samples/sample-NNNN.ply, up to sample_points points each.
  nlohmann::json samples = nlohmann::json::array();
  const fs::path sample_dir = dir / "samples";
  if (fs::is_directory(sample_dir)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(sample_dir))
      if (entry.path().extension() == ".ply") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    if (files.size() > static_cast<size_t>(std::max<int64_t>(options.samples, 0)))
      files.resize(static_cast<size_t>(options.samples));
    int64_t unreadable = 0;
    for (const auto& file : files) {
      torch::Tensor xyz, rgb;
      try {  // one damaged file (or one `tessera sample` is still writing) costs only itself
        std::tie(xyz, rgb) = data::read_ply_points(file.string());
      } catch (const std::exception&) {
        ++unreadable;
        continue;
      }
      const int64_t n = xyz.size(0);
      const auto picked = spread(static_cast<size_t>(n), static_cast<size_t>(options.sample_points));
      const auto p = xyz.to(torch::kFloat64).contiguous();
      const auto c = rgb.to(torch::kUInt8).contiguous();
      const double* pv = p.data_ptr<double>();
      const uint8_t* cv = c.data_ptr<uint8_t>();
      nlohmann::json points = nlohmann::json::array();
      for (size_t i : picked) {
        for (int k = 0; k < 3; ++k) points.push_back(std::round(pv[i * 3 + k] * 1e4) / 1e4);
        for (int k = 0; k < 3; ++k) points.push_back(cv[i * 3 + k]);
      }
      samples.push_back({{"name", file.filename().string()}, {"count", n}, {"points", points}});
    }
    data["samples_unreadable"] = unreadable;
  }
  summary.samples = static_cast<int64_t>(samples.size());
  data["samples"] = samples;
  int64_t dropped = 0;
  data["warnings"] = log_warnings(dir / "logs", 20, dropped);
  data["warnings_dropped"] = dropped;

  // Into the page: every '<', '>' and '&' as a JSON \u escape, so that no string in the data
  // (a path, a log line) can end or restart the script element ("</script>", "<!--<script>");
  // JSON.parse reads them back as they were. Bytes that are not UTF-8 (a host or file name)
  // become U+FFFD.
  const std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string escaped;
  escaped.reserve(json.size() + json.size() / 64);
  for (const char c : json) {
    if (c == '<') escaped += "\\u003c";
    else if (c == '>') escaped += "\\u003e";
    else if (c == '&') escaped += "\\u0026";
    else escaped += c;
  }
  std::string page = report_page_template();
  const std::string placeholder = "TESSERA_REPORT_DATA";
  const size_t at = page.find(placeholder);
  if (at == std::string::npos) throw std::logic_error("report page template has no data placeholder");
  page.replace(at, placeholder.size(), escaped);

  data::write_whole_file(summary.path, page, "report");
  summary.bytes = static_cast<int64_t>(page.size());
  return summary;
}

}  // namespace tessera
