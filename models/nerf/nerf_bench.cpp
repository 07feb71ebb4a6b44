// `tessera bench nerf`: NeRF training throughput (global rays/s through the RayTrainer), and the
// memory and time of activation checkpointing policies and of gradient accumulation on a fixed
// batch of nerf-mlp, at one precision. One JSON object per line on rank 0's stdout; progress on stderr.
#include <CLI/CLI.hpp>
#include <ATen/autocast_mode.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/autocast.h"
#include "framework/checkpoint_policy.h"
#include "framework/config.h"
#include "framework/data/scene.h"
#include "framework/data/synth.h"
#include "framework/log.h"
#include "framework/memory.h"
#include "models/nerf/ray_model.h"
#include "framework/phase_timer.h"
#include "models/nerf/ray_sampler.h"
#include "models/nerf/ray_trainer.h"
#include "framework/bench_util.h"
#include "models/nerf/nerf_family.h"

namespace tessera::models::nerf {

namespace {

struct NerfBenchOptions {
  std::string scene;                // dataset file; "" = synthesize one per rank in a temp dir
  std::string preset = "objects";   // synthetic scene preset
  int views = 16;                   // synthetic scene views
  int size = 64;                    // synthetic scene width = height
  std::string cases = "throughput,checkpoint,accumulate";
  std::string models = "nerf-hash,nerf-mlp";  // throughput models
  int64_t train_rays = 1024;        // throughput: global rays per optimizer step
  int64_t steps = 5;                // throughput: timed steps per model
  int64_t warmup = 1;               // throughput: untimed steps first
  int64_t rays = 1024;              // checkpoint / accumulate: rays of the fixed batch (per rank)
  int repeats = 3;                  // checkpoint / accumulate: timed steps per case (median)
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (fp16 on CUDA only, as a run)
  bool deterministic = false;       // throughput: also time run.deterministic, side by side
  int64_t unit_rays = 0;            // its nerf.unit_rays (0: the key's default rule)
  uint64_t seed = 0;
  double timeout_s = 600;
};


// fp16 runs on CUDA only (a run refuses it on the CPU); bf16 autocast runs on the CPU too.
std::string cpu_precision_error(const std::string& precision) {
  return "bench nerf --precision " + precision + ": needs a CUDA device for every rank, and this "
         "run is on the CPU (fp16 runs on CUDA only); use --precision bf16 or fp32";
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

bool has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}


struct StepMeasurement {
  double seconds = 0;    // median over repeats, slowest rank
  double vs_first = 1;   // median over rounds of seconds / the first case's seconds that round
  int64_t peak = 0;      // peak bytes above the step's start, max over repeats and ranks
  PhaseTimes phases;     // rank 0's medians: forward, backward and (when checkpointing) recompute
};

// One case of the fixed-batch measurements: what to set on the model first, and in how many
// micro-batches to split the batch.
struct FixedCase {
  std::function<void()> apply;
  int64_t k = 1;
};

// Forward + backward of `batch` in `k` micro-batches (the RayTrainer's loss and split), with
// gradients set to none first so that every step allocates the same. Peak relative to the start.
// The phases: "forward" (render and loss), "backward", and "recompute" (the checkpoints'
// recomputes, not charged to "backward").
struct OneStep {
  double seconds = 0;
  double peak = 0;
  PhaseTimes phases;
};
OneStep run_fixed_step(MPI_Comm comm, Model& model, const std::vector<torch::Tensor>& params,
                       const RayBatch& batch, int64_t k, torch::Device device,
                       const std::string& precision) {
  const int64_t rays = batch.ray_ids.size(0);
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  bench::sync(device);
  MPI_CHECK(MPI_Barrier(comm));
  const int64_t start_bytes = memory_stats(device).current_bytes;
  reset_peak(device);
  PhaseTimer timer(device);
  timer.start();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < k; ++i) {
    const RayBatch micro = narrow_rays(batch, rays * i / k, rays * (i + 1) / k - rays * i / k);
    StepContext ctx;
    ctx.step = 0;
    ctx.training = true;
    ctx.phases = &timer;
    torch::Tensor loss;
    {
      AutocastScope autocast(precision, device);
      const RenderResult out = model.render(micro, ctx);
      loss = (out.rgb.to(torch::kFloat32) - micro.target_rgb).pow(2).sum() / (3.0 * rays);
    }
    timer.lap("forward");
    loss.backward();
    timer.lap("backward");
  }
  bench::sync(device);
  OneStep step;
  step.seconds = bench::max_over_ranks(
      comm, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  step.peak = bench::max_over_ranks(
      comm, static_cast<double>(memory_stats(device).peak_bytes - start_bytes));
  // The model's own laps (march, encode, mlp, composite) are parts of "forward" here.
  for (const auto& [phase, seconds] : timer.times())
    add_phase(step.phases, phase == "recompute" || phase == "backward" ? phase : "forward",
              seconds);
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  return step;
}

// Measures the cases in rounds, one step of each case per round, so that a slow spell of the
// machine falls on every case alike; the first round is a warm-up. Each case's ratio to the first
// case is the median of the ratios within a round, which the machine's drift cancels out of.
std::vector<StepMeasurement> measure_fixed(MPI_Comm comm, Model& model, const RayBatch& batch,
                                           const std::vector<FixedCase>& cases, int repeats,
                                           torch::Device device, const std::string& precision) {
  std::vector<torch::Tensor> params;
  for (auto& group : model.parameter_groups())
    for (auto& p : group.params) params.push_back(p);
  std::vector<std::vector<double>> times(cases.size()), ratios(cases.size());
  std::vector<std::vector<PhaseTimes>> phases(cases.size());
  std::vector<StepMeasurement> result(cases.size());
  for (int round = 0; round < repeats + 1; ++round)
    for (size_t c = 0; c < cases.size(); ++c) {
      cases[c].apply();
      const OneStep step = run_fixed_step(comm, model, params, batch, cases[c].k, device, precision);
      if (round == 0) continue;
      times[c].push_back(step.seconds);
      ratios[c].push_back(step.seconds / times[0].back());
      phases[c].push_back(step.phases);
      result[c].peak = std::max(result[c].peak, static_cast<int64_t>(step.peak));
    }
  for (size_t c = 0; c < cases.size(); ++c) {
    result[c].seconds = bench::median(times[c]);
    result[c].vs_first = bench::median(ratios[c]);
    result[c].phases = median_phases(phases[c]);
  }
  return result;
}

double phase_seconds(const PhaseTimes& phases, const std::string& name) {
  for (const auto& [phase, seconds] : phases)
    if (phase == name) return seconds;
  return 0.0;
}

std::unique_ptr<Model> create_model(const std::string& name, const data::SceneReader& scene,
                                    torch::Device device, uint64_t seed) {
  ModelRegistry registry;
  register_nerf_models(registry);
  registry.require(name, "bench nerf");
  Config config;
  config.model.name = name;
  config.run.seed = static_cast<int64_t>(seed);
  const ModelContext context = ModelContext::from_scene(scene, device);
  return registry.create(config, context);
}

int run_nerf_bench(const NerfBenchOptions& options) {
  const auto cases = split_list(options.cases);
  for (const auto& c : cases)
    if (c != "throughput" && c != "checkpoint" && c != "accumulate")
      throw UserError("bench nerf: unknown case '" + c + "' (known: throughput, checkpoint, accumulate)");
  if (options.rays < 8) throw UserError("bench nerf: --rays must be >= 8 (accumulation splits it 8 ways)");
  if (options.precision != "fp32" && options.precision != "bf16" && options.precision != "fp16")
    throw UserError("bench nerf: --precision must be fp32, bf16 or fp16 (got '" + options.precision + "')");
  // Before MPI starts where no GPU is visible at all, so that the launcher's rank 0 says it once.
  if (options.precision == "fp16" && !torch::cuda::is_available())
    throw UserError(cpu_precision_error(options.precision));

  distributed::ProcessContext context(nullptr, nullptr, options.timeout_s);
  log::init({context.rank(), "warn", "", true});
  const int threads = context.apply_thread_share(0);
  const int rank = context.rank(), ranks = context.size();
  const MPI_Comm world = context.world();
  const torch::Device device = context.one_cuda_device_per_rank()
                                   ? torch::Device(torch::kCUDA, context.cuda_device_index())
                                   : torch::Device(torch::kCPU);
  if (options.precision == "fp16" && device.is_cpu())
    throw UserError(cpu_precision_error(options.precision));
  if (device.is_cpu()) install_counting_cpu_allocator();
  auto comm = distributed::make_communicator(context, "auto", device);
  const char* precision = options.precision.c_str();
  bench::progress(rank, "nerf", "%d rank(s) on %s, %d CPU threads per rank, %s", ranks, device.str().c_str(),
           threads, precision);

  std::unique_ptr<bench::TempDir> temp;
  const std::string scene_path =
      bench::bench_scene("nerf", rank, options.scene, options.preset, options.views, options.size,
                         options.seed, temp);
  const data::SceneReader scene(scene_path);

  // Throughput: optimizer steps through the RayTrainer, global rays/s over the timed steps.
  if (has(cases, "throughput")) {
    std::vector<bool> modes = {false};
    if (options.deterministic) modes.push_back(true);
    for (const std::string& name : split_list(options.models))
    for (const bool deterministic : modes) {
      bench::progress(rank, "nerf", "throughput %s%s: %lld + %lld steps of %lld rays", name.c_str(),
               deterministic ? " (run.deterministic)" : "",
               static_cast<long long>(options.warmup), static_cast<long long>(options.steps),
               static_cast<long long>(options.train_rays));
      auto model = create_model(name, scene, device, options.seed);
      RayTrainerOptions trainer_options;
      trainer_options.steps = options.warmup + options.steps;
      trainer_options.nerf.rays_per_step = options.train_rays;
      trainer_options.nerf.lr_schedule = "constant";  // the step's cost, not the schedule's
      trainer_options.nerf.background = "dataset";
      trainer_options.seed = options.seed;
      trainer_options.sampling.total_steps = trainer_options.steps;
      trainer_options.log_every = 0;
      trainer_options.out_dir = "";
      trainer_options.progress = false;
      trainer_options.precision = options.precision;
      trainer_options.deterministic = deterministic;
      trainer_options.nerf.unit_rays = options.unit_rays;
      RayTrainer trainer(context, *comm, *model, scene, trainer_options);
      for (int64_t step = 0; step < options.warmup; ++step) trainer.train_step(step);
      bench::sync(device);
      MPI_CHECK(MPI_Barrier(world));
      const auto start = std::chrono::steady_clock::now();
      std::vector<PhaseTimes> phases;
      for (int64_t step = options.warmup; step < options.warmup + options.steps; ++step)
        phases.push_back(trainer.train_step(step).phases);
      bench::sync(device);
      const double seconds =
          bench::max_over_ranks(world, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      const double rays_per_s = static_cast<double>(options.steps * options.train_rays) / seconds;
      if (rank == 0) {
        std::printf("{\"bench\":\"nerf\",\"case\":\"throughput\",\"model\":\"%s\",\"ranks\":%d,"
                    "\"precision\":\"%s\",\"deterministic\":%s,\"unit_rays\":%lld,"
                    "\"rays_per_s\":%.1f,\"phases_s\":%s}\n",
                    name.c_str(), ranks, precision, deterministic ? "true" : "false",
                    static_cast<long long>(options.unit_rays), rays_per_s,
                    bench::phases_json(median_phases(phases)).c_str());
        std::fflush(stdout);
      }
    }
  }

  if (!has(cases, "checkpoint") && !has(cases, "accumulate")) return kExitOk;
  // A fixed batch (the same on every rank: these cases measure one rank's step, run side by side).
  RaySampler sampler(scene, {options.rays, options.seed}, [](int64_t) { return 1.0; });
  const RayBatch batch = sampler.rank_batch(0, 0, 1, device);
  auto model = create_model("nerf-mlp", scene, device, options.seed);

  if (has(cases, "checkpoint")) {
    StepContext ctx;
    ctx.training = true;
    const auto infos = model->measure_segments(batch, ctx);
    auto chosen_by = [&infos](const CheckpointPlan& p) {
      std::vector<std::string> names;
      for (size_t i = 0; i < infos.size(); ++i)
        if (p.is_checkpointed(i)) names.push_back(infos[i].name);
      return names;
    };
    CheckpointPolicyOptions every_segment;
    every_segment.every = 1;
    const CheckpointPlan segments_plan = make_checkpoint_policy("segments", every_segment)->plan(infos);
    // The budget midway between the predicted peaks of "segments" and of keeping everything: a
    // plan that trades some of the memory "segments" saves for less recompute.
    const CheckpointPlan none_plan = make_checkpoint_policy("none")->plan(infos);
    CheckpointPolicyOptions budget_options;
    budget_options.budget_mib =
        std::max(0.5 * static_cast<double>(segments_plan.peak_bytes + none_plan.peak_bytes), 1.0) /
        (1024.0 * 1024.0);
    const CheckpointPlan plan = make_checkpoint_policy("budget", budget_options)->plan(infos);
    bench::progress(rank, "nerf", "measured segments of nerf-mlp on %lld rays (rank 0):\n%s",
             static_cast<long long>(options.rays), plan.text.c_str());
    // "segments" as a run configures it (every = 1: all but the last); "all" names every
    // segment, the last included, to show what that last recompute costs.
    const std::vector<std::pair<std::string, std::vector<std::string>>> policies = {
        {"none", {}},
        {"segments", chosen_by(segments_plan)},
        {"all", model->segment_names()},
        {"budget", chosen_by(plan)}};
    bench::progress(rank, "nerf", "checkpoint none / segments (%zu) / all (%zu) / budget (%zu): %d + 1 rounds of %lld rays",
                    policies[1].second.size(), policies[2].second.size(), policies[3].second.size(),
                    options.repeats, static_cast<long long>(options.rays));
    std::vector<FixedCase> fixed;
    for (const auto& [policy, chosen] : policies)
      fixed.push_back({[&model, chosen = chosen] { model->set_checkpointed_segments(chosen); }, 1});
    const std::vector<StepMeasurement> ms =
        measure_fixed(world, *model, batch, fixed, options.repeats, device, options.precision);
    for (size_t c = 0; c < policies.size(); ++c) {
      const StepMeasurement& m = ms[c];
      const double recompute = phase_seconds(m.phases, "recompute");
      if (rank == 0) {
        std::printf("{\"bench\":\"nerf\",\"case\":\"checkpoint\",\"model\":\"mlp\",\"policy\":\"%s\","
                    "\"precision\":\"%s\",\"checkpointed\":%zu,\"rays\":%lld,\"peak_bytes\":%lld,"
                    "\"step_s\":%.4f,\"vs_none\":%.4f,\"forward_s\":%.4f,\"backward_s\":%.4f,"
                    "\"recompute_s\":%.4f,\"recompute_share\":%.4f}\n",
                    policies[c].first.c_str(), precision, policies[c].second.size(),
                    static_cast<long long>(options.rays), static_cast<long long>(m.peak), m.seconds,
                    m.vs_first, phase_seconds(m.phases, "forward"), phase_seconds(m.phases, "backward"),
                    recompute, m.seconds > 0 ? recompute / m.seconds : 0.0);
        std::fflush(stdout);
      }
    }
    model->set_checkpointed_segments({});
  }

  if (has(cases, "accumulate")) {
    const std::vector<int64_t> ks = {1, 2, 4, 8};
    bench::progress(rank, "nerf", "accumulate k = 1, 2, 4, 8: %d + 1 rounds of %lld rays",
                    options.repeats, static_cast<long long>(options.rays));
    std::vector<FixedCase> fixed;
    for (int64_t k : ks) fixed.push_back({[] {}, k});
    const std::vector<StepMeasurement> ms =
        measure_fixed(world, *model, batch, fixed, options.repeats, device, options.precision);
    for (size_t c = 0; c < ks.size(); ++c)
      if (rank == 0) {
        std::printf("{\"bench\":\"nerf\",\"case\":\"accumulate\",\"model\":\"mlp\",\"precision\":\"%s\","
                    "\"k\":%lld,\"rays\":%lld,\"peak_bytes\":%lld,\"step_s\":%.4f,\"vs_k1\":%.4f}\n",
                    precision, static_cast<long long>(ks[c]), static_cast<long long>(options.rays),
                    static_cast<long long>(ms[c].peak), ms[c].seconds, ms[c].vs_first);
        std::fflush(stdout);
      }
  }
  return kExitOk;
}

}  // namespace

// Adds `bench nerf` under `bench`; returns whether it was chosen and how to run it.
bench::BenchCommand add_nerf_bench(CLI::App& bench) {
  auto o = std::make_shared<NerfBenchOptions>();
  CLI::App* sub = bench.add_subcommand(
      "nerf", "NeRF training throughput (global rays/s; run under mpirun -np N and compare with a "
              "1-rank run), and peak memory / step time of checkpoint policies and gradient "
              "accumulation on a fixed nerf-mlp batch");
  sub->add_option("--scene", o->scene, "Dataset file (.h5); default: synthesize one per rank in a temp dir")
      ->check(CLI::ExistingFile);
  sub->add_option("--preset", o->preset, "Synthetic scene preset (without --scene)")->capture_default_str();
  sub->add_option("--views", o->views, "Synthetic scene views (without --scene)")
      ->capture_default_str()
      ->check(CLI::Range(3, 10000));
  sub->add_option("--size", o->size, "Synthetic scene image width and height (without --scene)")
      ->capture_default_str()
      ->check(CLI::Range(8, 8192));
  sub->add_option("--cases", o->cases, "Comma-separated cases to run: throughput, checkpoint, accumulate")
      ->capture_default_str();
  sub->add_option("--models", o->models, "Comma-separated models for the throughput case")
      ->capture_default_str();
  sub->add_option("--train-rays", o->train_rays, "Throughput: global rays per optimizer step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--steps", o->steps, "Throughput: timed optimizer steps per model")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  sub->add_option("--warmup", o->warmup, "Throughput: untimed optimizer steps first")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  sub->add_option("--rays", o->rays, "Checkpoint / accumulate: rays of the fixed batch, per rank")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  sub->add_option("--repeats", o->repeats, "Checkpoint / accumulate: timed steps per case (median), after one warm-up")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  sub->add_option("--precision", o->precision,
                  "fp32, bf16 or fp16: the RayTrainer's train.precision for the throughput case and "
                  "autocast around the fixed-batch forward passes (fp16 needs CUDA and its "
                  "steps use the loss scaler); every JSON line carries it")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_flag("--deterministic", o->deterministic,
                "Throughput: time each model on the float path and with run.deterministic "
                "(bitwise at any world size), side by side (JSON key deterministic)");
  sub->add_option("--unit-rays", o->unit_rays,
                  "Throughput with --deterministic: rays per work unit (nerf.unit_rays; 0: "
                  "--train-rays / 16, at least 256)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of the scene, the models and the batches")->capture_default_str();
  return {sub, [o] { return run_nerf_bench(*o); }};
}

}  // namespace tessera::models::nerf
