// `tessera plan CONFIG --gaussians G --ranks N`: the capacity plan of sharded 3DGS training
// (gaussian_plan.h) as one JSON line, with a summary on stderr. Needs no MPI. Added to the
// command line through models/builtin.h (launch/ knows no family).
#include <CLI/CLI.hpp>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/errors.h"
#include "framework/config.h"
#include "framework/data/scene.h"
#include "framework/family.h"
#include "framework/memory.h"
#include "framework/bench_util.h"
#include "models/gaussians/gaussian_config.h"
#include "models/gaussians/gaussian_plan.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::models::gaussians {

namespace {

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string gaussians;
  int ranks = 1;
  std::string image_size;
  int64_t train_views = -1;  // -1: from the config's dataset when it can be read, else 0
  std::string gpu_memory;
  double usable = 0.9;
  double visible = 1.0;
  double ranks_touched = 1.5;
};

// "10M", "2.5e6", "1B", "100000" -> a count; k, M, B (or G) are powers of 1000.
int64_t parse_count(const std::string& text, const char* flag) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw UserError(std::string("plan: ") + flag + " '" + text + "' is not a number");
  }
  std::string suffix = text.substr(used);
  double scale = 1;
  if (suffix == "k" || suffix == "K") scale = 1e3;
  else if (suffix == "M" || suffix == "m") scale = 1e6;
  else if (suffix == "B" || suffix == "G" || suffix == "b" || suffix == "g") scale = 1e9;
  else if (!suffix.empty())
    throw UserError(std::string("plan: ") + flag + " '" + text +
                    "': the suffix must be k, M or B (powers of 1000)");
  const double exact = value * scale;
  if (!(exact >= 1 && exact <= kMaxPlanGaussians) || exact != std::floor(exact))
    throw UserError(std::string("plan: ") + flag + " '" + text +
                    "' must be a whole number from 1 to 1e15");
  const double count = exact;
  return static_cast<int64_t>(count);
}

// "141GB", "80GiB", "24e9", "512MiB" -> bytes (GB = 1e9, GiB = 2^30; a bare number is bytes).
double parse_bytes(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw UserError("plan: --gpu-memory '" + text + "' is not a size (e.g. 141GB or 80GiB)");
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "B"  ? 1
                       : unit == "kB" || unit == "KB" ? 1e3
                       : unit == "MB"                 ? 1e6
                       : unit == "GB"                 ? 1e9
                       : unit == "TB"                 ? 1e12
                       : unit == "KiB"                ? 1024.0
                       : unit == "MiB"                ? 1048576.0
                       : unit == "GiB"                ? 1073741824.0
                       : unit == "TiB"                ? 1099511627776.0
                                                      : -1;
  if (scale < 0)
    throw UserError("plan: --gpu-memory '" + text + "': the unit must be B, kB, MB, GB, TB, "
                    "KiB, MiB, GiB or TiB");
  if (!(value > 0) || !std::isfinite(value * scale) || value * scale > 1e18)
    throw UserError("plan: --gpu-memory '" + text + "' must be above 0 and at most 1 EB");
  return value * scale;
}

// "1920x1080" or "512" (square) -> width, height.
void parse_size(const std::string& text, int64_t& width, int64_t& height) {
  const size_t x = text.find('x');
  try {
    size_t used = 0;
    width = std::stoll(text.substr(0, x), &used);
    if (used != (x == std::string::npos ? text.size() : x)) throw std::invalid_argument(text);
    height = width;
    if (x != std::string::npos) {
      height = std::stoll(text.substr(x + 1), &used);
      if (used != text.size() - x - 1) throw std::invalid_argument(text);
    }
  } catch (const std::exception&) {
    throw UserError("plan: --image-size '" + text + "' must be WIDTHxHEIGHT or SIZE (e.g. 1920x1080)");
  }
  if (width < 1 || height < 1 || width > (1 << 20) || height > (1 << 20))
    throw UserError("plan: --image-size '" + text + "' must be 1 to 1048576 pixels a side");
}

int run_plan(const PlanOptions& o, const std::function<void(FamilyRegistry&)>& register_families) {
  FamilyRegistry families;  // before the config: the families' sections are part of its schema
  register_families(families);
  const Config config = load_config(o.config_path, o.overrides);
  if (config.model.name != GaussianTrainer::kSnapshotModel)
    throw UserError("plan: " + o.config_path + " trains model '" + config.model.name +
                    "'; the capacity plan is for the gaussians family (its memory grows with "
                    "the scene; a radiance field's or a diffusion model's does not)");
  const GaussianConfig& g = config.section<GaussianConfig>();
  PlanRequest request;
  request.gaussians = parse_count(o.gaussians, "--gaussians");
  request.ranks = o.ranks;
  request.usable_fraction = o.usable;
  request.visible_fraction = o.visible;
  request.ranks_touched = o.ranks_touched;
  if (!o.gpu_memory.empty()) request.gpu_memory_bytes = parse_bytes(o.gpu_memory);
  std::string size_from = "--image-size";
  if (!o.image_size.empty()) parse_size(o.image_size, request.width, request.height);
  int64_t views = 0;
  if ((o.image_size.empty() || o.train_views < 0) && !config.data.path.empty() &&
      std::filesystem::exists(config.data.path)) {
    const data::SceneReader scene(config.data.path);
    int64_t w = 0, h = 0;
    for (size_t i : scene.indices(data::Split::Train)) {
      const data::Camera& c = scene.cameras().at(i);
      w = std::max<int64_t>(w, std::llround(c.width / g.resolution_scale));
      h = std::max<int64_t>(h, std::llround(c.height / g.resolution_scale));
      ++views;
    }
    if (o.image_size.empty() && views > 0) {  // a dataset without train views gives no size
      request.width = w;
      request.height = h;
      size_from = config.data.path;
    }
  }
  request.train_views = o.train_views >= 0 ? o.train_views : views;
  if (config.checkpoint.policy == "budget" && config.checkpoint.budget_mib > 0)
    request.budget_bytes = config.checkpoint.budget_mib * 1024.0 * 1024.0;
  const CapacityPlan plan = plan_capacity(g, request);
  std::printf("%s\n", plan_json(plan).c_str());
  std::fflush(stdout);
  std::fprintf(stderr,
               "plan: %lld Gaussians on %d rank(s), views of %lldx%lld (from %s), %lld view(s) "
               "per pass: %s per rank at the peak (%lld B per owned Gaussian, %lld B per pixel, "
               "%s of cached targets for %lld views); %s all-to-all and %s allreduce per step, "
               "summed over ranks\n",
               static_cast<long long>(request.gaussians), request.ranks,
               static_cast<long long>(request.width), static_cast<long long>(request.height),
               size_from.c_str(), static_cast<long long>(plan.views_per_pass),
               format_bytes(plan.peak_bytes_per_rank).c_str(),
               static_cast<long long>(plan.bytes_per_gaussian),
               static_cast<long long>(plan.bytes_per_pixel),
               format_bytes(plan.target_cache_bytes).c_str(),
               static_cast<long long>(request.train_views),
               format_bytes(static_cast<int64_t>(plan.all_to_all_bytes_per_step)).c_str(),
               format_bytes(static_cast<int64_t>(plan.allreduce_bytes_per_step)).c_str());
  if (plan.limited)
    std::fprintf(stderr, "plan: %s with %s per rank (%.0f%% usable): at most %lld Gaussians on "
                 "%d rank(s)\n", plan.fits ? "fits" : "does NOT fit", o.gpu_memory.c_str(),
                 100 * o.usable, static_cast<long long>(plan.max_count), request.ranks);
  return kExitOk;
}

}  // namespace

bench::BenchCommand add_plan_command(CLI::App& app,
                                     std::function<void(FamilyRegistry&)> register_families) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Capacity plan of sharded 3DGS training: per-rank peak memory, the bytes a step moves "
      "between ranks, and the largest scene that fits a GPU's memory, for G Gaussians on N "
      "ranks, from the per-Gaussian and per-pixel costs `tessera bench gaussians` measures "
      "(docs/gaussians.md, \"Capacity plan\"). One JSON line on stdout whose keys match the "
      "bench's (peak_bytes_per_rank, all_to_all_bytes_per_step, ...), a summary on stderr. "
      "Needs no MPI");
  sub->add_option("config", o->config_path,
                  "A gaussians config (views per step and pass, cache_targets; data.path gives "
                  "the image size and train views when the dataset exists)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--set", o->overrides,
                  "Override a config key, as for train: --set gaussians.views_per_step=4. "
                  "Repeatable")
      ->type_name("KEY=VALUE");
  sub->add_option("--gaussians", o->gaussians,
                  "Gaussians in the whole scene: a count, with k, M or B for thousands, "
                  "millions, billions (10M, 1B)")
      ->required();
  sub->add_option("--ranks", o->ranks, "Ranks (GPUs) the Gaussians are sharded over")
      ->default_val(o->ranks)
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--image-size", o->image_size,
                  "The largest training view as rendered, WIDTHxHEIGHT or SIZE; default: from "
                  "the config's dataset (after gaussians.resolution_scale)");
  sub->add_option("--train-views", o->train_views,
                  "Train views whose targets every rank caches (gaussians.cache_targets); "
                  "default: the dataset's, or 0 without one")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  sub->add_option("--gpu-memory", o->gpu_memory,
                  "Memory per rank (141GB for an H200, 80GB for an H100; GB = 1e9, GiB = 2^30): "
                  "says whether the scene fits and the largest that does");
  sub->add_option("--usable", o->usable,
                  "Share of --gpu-memory the allocator's peak may take (the rest: CUDA context, "
                  "NCCL buffers, fragmentation)")
      ->default_val(o->usable)
      ->check(CLI::Range(0.01, 1.0));
  sub->add_option("--visible", o->visible,
                  "Share of the scene's Gaussians a training view sees (1: an object in full "
                  "view; a large scene's view sees much less)")
      ->default_val(o->visible)
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--ranks-touched", o->ranks_touched,
                  "Ranks' tile blocks a visible Gaussian's footprint touches on average "
                  "(measured 1.33 to 1.64 on 2 and 4 ranks at 128x128)")
      ->default_val(o->ranks_touched)
      ->check(CLI::Range(1.0, 1e6));
  return {sub, [o, register_families] { return run_plan(*o, register_families); }};
}

}  // namespace tessera::models::gaussians
