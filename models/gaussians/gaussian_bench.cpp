// `tessera bench gaussians`: step time and peak memory per rank of the sharded 3DGS family at
// exactly --count Gaussians, its steps taken by the framework's TrainingRun as in training, one
// JSON line on rank 0.
#include <CLI/CLI.hpp>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/data/scene.h"
#include "framework/data/synth.h"
#include "framework/log.h"
#include "framework/memory.h"
#include "framework/run.h"
#include "framework/bench_util.h"
#include "models/gaussians/gaussian_family.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::models::gaussians {

namespace {

namespace gs = tessera::models::gaussians;

struct GaussianBenchOptions {
  int64_t count = -1;              // Gaussians, exactly (random in the scene bounds); not given
                                   // (-1) with --scene: the scene's points, as training uses
  int64_t steps = 5;               // timed steps
  int64_t warmup = 1;              // untimed steps first
  int64_t views_per_step = 1;      // views rendered per step
  int sh_degree = gs::kMaxShDegree;
  std::string scene;               // dataset file; "" = synthesize one per rank in a temp dir
  std::string preset = "objects";  // synthetic scene preset
  int views = 16;                  // synthetic scene views
  int size = 128;                  // synthetic scene width = height
  std::string device = "auto";
  uint64_t seed = 0;
  double timeout_s = 1800;
  std::string export_ply;          // "": none; else the trained set is exported here at the end
};

// Checked before MPI starts, so that every rank fails alike and the launcher's rank 0 says why.
void validate(const GaussianBenchOptions& o) {
  auto fail = [](const std::string& what) { throw UserError("bench gaussians: " + what); };
  if (o.count == -1 && o.scene.empty())
    fail("--count is required without --scene (a dataset whose points start the Gaussians)");
  if (o.count != -1 && o.count < 1)
    fail("--count must be >= 1 (got " + std::to_string(o.count) + ")");
  if (o.steps < 1) fail("--steps must be >= 1 (got " + std::to_string(o.steps) + ")");
  if (o.warmup < 0) fail("--warmup must be >= 0 (got " + std::to_string(o.warmup) + ")");
  if (o.views_per_step < 1)
    fail("--views-per-step must be >= 1 (got " + std::to_string(o.views_per_step) + ")");
  if (o.sh_degree < 0 || o.sh_degree > gs::kMaxShDegree)
    fail("--sh-degree must be in [0, " + std::to_string(gs::kMaxShDegree) + "] (got " +
         std::to_string(o.sh_degree) + ")");
  if (o.scene.empty() && (o.size < 8 || o.size > 8192))
    fail("--size must be in [8, 8192] (got " + std::to_string(o.size) + ")");
  if (o.scene.empty() && (o.views < 3 || o.views > 10000))
    fail("--views must be in [3, 10000] (got " + std::to_string(o.views) + ")");
  if (!(o.timeout_s > 0)) fail("--timeout must be > 0");
  if (!o.export_ply.empty()) {
    const std::filesystem::path parent = std::filesystem::path(o.export_ply).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent))
      fail("--export-ply: the folder " + parent.string() + " does not exist");
  }
}


// The trainer at a fixed count: random init of exactly `count` Gaussians (the scene's points
// ignored), or the scene's points when count is -1 (not given); no densification, pruning or opacity reset,
// no rebalancing after the initial one, the full SH degree from the first step.
gs::GaussianTrainerOptions trainer_options(const GaussianBenchOptions& o) {
  gs::GaussianTrainerOptions t;
  t.views_per_step = o.views_per_step;
  t.steps = o.warmup + o.steps;
  t.seed = o.seed;
  t.init.random_count = std::max<int64_t>(o.count, 0);
  t.init.ignore_points = o.count > 0;
  t.init.seed = o.seed;
  t.densify.densify_until = 0;  // no statistics, densification, pruning or opacity reset
  t.densify.seed = o.seed;
  t.rebalance_every = 0;        // only after densification, which never happens
  t.max_sh_degree = o.sh_degree;
  t.sh_degree_interval = 0;     // the full degree at once
  return t;
}

int run_gaussian_bench(const GaussianBenchOptions& options) {
  validate(options);
  distributed::ProcessContext context(nullptr, nullptr, options.timeout_s);
  log::init({context.rank(), "warn", "", true});
  const int threads = context.apply_thread_share(0);
  const int rank = context.rank(), ranks = context.size();
  const MPI_Comm world = context.world();
  const torch::Device device = bench::bench_device(context, options.device, "gaussians");
  auto comm = distributed::make_communicator(context, "auto", device);
  bench::progress(rank, "gaussians", "%d rank(s) on %s, %d CPU threads per rank", ranks, device.str().c_str(), threads);

  std::unique_ptr<bench::TempDir> temp;
  const std::string scene_path =
      bench::bench_scene("gaussians", rank, options.scene, options.preset, options.views, options.size,
                         options.seed, temp);
  const data::SceneReader scene(scene_path);

  // The peak from here on: this rank's slice of the initial set and the neighbour search over all
  // the means, the owned shard after the Morton split, Adam's moments, gradients and the steps'
  // activations.
  bench::sync(device);
  MPI_CHECK(MPI_Barrier(world));
  reset_peak(device);
  if (options.count > 0)
    bench::progress(rank, "gaussians", "initializing %lld Gaussians at random in the scene bounds",
                    static_cast<long long>(options.count));
  else
    bench::progress(rank, "gaussians", "initializing from the points of %s", scene_path.c_str());
  const auto init_start = std::chrono::steady_clock::now();
  gs::GaussianFamily family(*comm, scene, trainer_options(options));
  gs::GaussianTrainer& trainer = family.trainer();
  bench::sync(device);
  const double init_s = bench::max_over_ranks(
      world, std::chrono::duration<double>(std::chrono::steady_clock::now() - init_start).count());
  const int64_t global = trainer.global_count();
  if (options.count > 0 && global != options.count)
    throw std::logic_error("bench gaussians: the trainer holds " + std::to_string(global) +
                           " Gaussians, not --count " + std::to_string(options.count));
  const double max_local = bench::max_over_ranks(world, static_cast<double>(trainer.local_count()));
  bench::progress(rank, "gaussians", "initialized in %.2f s, at most %lld Gaussians per rank; %lld + %lld steps of %lld "
           "view(s), SH degree %d", init_s, static_cast<long long>(max_local),
           static_cast<long long>(options.warmup), static_cast<long long>(options.steps),
           static_cast<long long>(options.views_per_step), options.sh_degree);
  // The peak of training alone (after the initial set is gone): what falls as 1 / ranks.
  const int64_t construction_peak = trainer.memory().peak_bytes;
  reset_peak(device);

  // The steps as training takes them: TrainingRun::train_step (the family's forward and
  // backward, the agreed non-finite check, the update), writing nothing.
  RunOptions run_options;
  run_options.steps = options.warmup + options.steps;
  run_options.seed = options.seed;
  run_options.progress = false;
  run_options.not_learning_steps = 0;
  TrainingRun run(context, *comm, family, scene, run_options);
  std::vector<double> times;
  std::vector<PhaseTimes> phases;
  distributed::Traffic timed_traffic;  // this rank's collectives over the timed steps
  for (int64_t t = 0; t < options.warmup + options.steps; ++t) {
    bench::sync(device);
    MPI_CHECK(MPI_Barrier(world));
    const distributed::Traffic before = comm->traffic();
    const auto start = std::chrono::steady_clock::now();
    const StepRecord r = run.train_step(t);
    bench::sync(device);
    if (t >= options.warmup) {
      timed_traffic.all_to_all_bytes += comm->traffic().all_to_all_bytes - before.all_to_all_bytes;
      timed_traffic.allreduce_bytes += comm->traffic().allreduce_bytes - before.allreduce_bytes;
    }
    const double seconds =
        bench::max_over_ranks(world, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    const bool timed = t >= options.warmup;
    if (timed) times.push_back(seconds);
    if (timed) phases.push_back(r.phases);
    bench::progress(rank, "gaussians", "step %lld%s: %.3f s, loss %.4f", static_cast<long long>(t + 1),
             timed ? "" : " (warm-up)", seconds, r.loss);
  }
  const int64_t steady_peak = trainer.memory().peak_bytes;
  double export_s = 0;
  if (!options.export_ply.empty()) {
    bench::progress(rank, "gaussians", "exporting %lld Gaussians to %s",
                    static_cast<long long>(global), options.export_ply.c_str());
    const auto export_start = std::chrono::steady_clock::now();
    trainer.export_ply(options.export_ply);
    export_s = bench::max_over_ranks(
        world, std::chrono::duration<double>(std::chrono::steady_clock::now() - export_start).count());
  }
  const double peak = bench::max_over_ranks(world, static_cast<double>(std::max(construction_peak, steady_peak)));
  const double steady = bench::max_over_ranks(world, static_cast<double>(steady_peak));
  // Summed over ranks: what the whole job holds per Gaussian, and moves per step.
  const double peak_sum =
      bench::sum_over_ranks(world, static_cast<double>(std::max(construction_peak, steady_peak)));
  const double steps = static_cast<double>(options.steps);
  const double all_to_all =
      bench::sum_over_ranks(world, static_cast<double>(timed_traffic.all_to_all_bytes)) / steps;
  const double allreduce =
      bench::sum_over_ranks(world, static_cast<double>(timed_traffic.allreduce_bytes)) / steps;
  const double step_s = bench::median(times);
  if (rank == 0) {
    std::printf("{\"bench\":\"gaussians\",\"count\":%lld,\"ranks\":%d,\"step_s\":%.6g,"
                "\"gaussians_per_s\":%.6g,\"peak_bytes_per_rank\":%lld,"
                "\"steady_peak_bytes_per_rank\":%lld,\"peak_bytes_per_gaussian\":%.1f,"
                "\"all_to_all_bytes_per_step\":%.0f,\"allreduce_bytes_per_step\":%.0f,"
                "\"max_gaussians_per_rank\":%lld,"
                "\"init_s\":%.4g,\"device\":\"%s\",\"size\":%lld,\"views_per_step\":%lld,"
                "\"sh_degree\":%d,\"steps\":%lld,\"export_s\":%.4g,\"phases_s\":%s}\n",
                static_cast<long long>(global), ranks, step_s,
                static_cast<double>(global) / step_s, static_cast<long long>(peak),
                static_cast<long long>(steady), peak_sum / static_cast<double>(global),
                all_to_all, allreduce, static_cast<long long>(max_local), init_s,
                device.is_cuda() ? "cuda" : "cpu",
                static_cast<long long>(scene.cameras().empty() ? 0 : scene.cameras()[0].width),
                static_cast<long long>(options.views_per_step), options.sh_degree,
                static_cast<long long>(options.steps), export_s,
                bench::phases_json(median_phases(phases)).c_str());
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace

// Adds `bench gaussians` under `bench`; returns whether it was chosen and how to run it.
bench::BenchCommand add_gaussian_bench(CLI::App& bench) {
  auto o = std::make_shared<GaussianBenchOptions>();
  CLI::App* sub = bench.add_subcommand(
      "gaussians",
      "Sharded 3DGS training at exactly --count Gaussians (random in the scene bounds), or from "
      "the points of a --scene dataset without --count; no densification, pruning or "
      "rebalancing after the initial Morton split: step time, time per phase and peak memory "
      "per rank. Run under mpirun -np N to see memory per rank fall as 1/N. One JSON line on "
      "rank 0's stdout: bench, count, ranks, step_s (median over the timed steps of the slowest "
      "rank's wall time), gaussians_per_s (count / step_s), peak_bytes_per_rank (max over ranks "
      "of the allocator's peak from the trainer's construction on: the rank's slice of the "
      "initial set, parameters, Adam state, gradients, activations; the counting CPU "
      "allocator, or the CUDA caching allocator), then steady_peak_bytes_per_rank (the same over "
      "the steps only), peak_bytes_per_gaussian (every rank's peak summed, over count), "
      "all_to_all_bytes_per_step and allreduce_bytes_per_step (the collectives' payload a timed "
      "step moves, summed over ranks: all-to-all rows bound for other ranks; allreduce "
      "tensors), max_gaussians_per_rank, init_s, the settings, and phases_s (rank 0's "
      "median seconds per phase of a step: project, sh, exchange, bin, rasterize, loss, "
      "rasterize_bwd, project_bwd, optimizer, densify, and the run's skip_check). Progress on stderr.");
  sub->add_option("--count", o->count,
                  "Gaussians in the scene (exactly; split across the ranks), drawn at random in "
                  "the scene bounds. Required without --scene; with --scene, leave it out to "
                  "start from the dataset's points (its /points, as training does)");
  sub->add_option("--steps", o->steps, "Timed training steps (step_s is their median)")
      ->capture_default_str();
  sub->add_option("--warmup", o->warmup, "Untimed training steps first")->capture_default_str();
  sub->add_option("--views-per-step", o->views_per_step, "Views rendered and compared per step")
      ->capture_default_str();
  sub->add_option("--sh-degree", o->sh_degree, "Spherical-harmonics degree used from the first step (0-3)")
      ->capture_default_str();
  sub->add_option("--scene", o->scene,
                  "Dataset file (.h5) whose train views are rendered and compared, and whose points "
                  "start the Gaussians unless --count is given; default: synthesize one per rank "
                  "in a temp dir")
      ->check(CLI::ExistingFile);
  sub->add_option("--preset", o->preset, "Synthetic scene preset (without --scene)")->capture_default_str();
  sub->add_option("--views", o->views, "Synthetic scene views (without --scene)")->capture_default_str();
  sub->add_option("--size", o->size, "Synthetic scene image width and height (without --scene)")
      ->capture_default_str();
  sub->add_option("--device", o->device,
                  "auto (CUDA when every rank has a device of its own), cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--seed", o->seed, "Seed of the scene, the Gaussians and the view order")
      ->capture_default_str();
  sub->add_option("--export-ply", o->export_ply,
                  "After the timed steps, export the Gaussians to this INRIA .ply (gathered to "
                  "rank 0 a chunk at a time, as training's export; export_s in the JSON): a "
                  "large random scene to start a training run from (gaussians.init_ply)");
  sub->add_option("--timeout", o->timeout_s,
                  "Seconds a rank may wait in one collective before the job is aborted (exit 3)")
      ->capture_default_str();
  return {sub, [o] { return run_gaussian_bench(*o); }};
}

}  // namespace tessera::models::gaussians
