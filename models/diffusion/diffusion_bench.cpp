// `tessera bench diffusion`: memory and time of the point-diffusion training step under each
// checkpoint policy, with ratios against policy none measured in the same run (docs/diffusion.md,
// "Memory"). The steps are the family's, taken by the framework's TrainingRun as training takes
// them, on one model whose recompute choice changes between steps. One JSON line per policy on
// rank 0's stdout.
#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/bench_util.h"
#include "framework/log.h"
#include "framework/memory.h"
#include "framework/config.h"
#include "framework/data/shapes.h"
#include "framework/run.h"
#include "models/diffusion/diffusion_family.h"
#include "models/diffusion/point_denoiser.h"

namespace tessera::models::diffusion {

namespace {

struct DiffusionBenchOptions {
  int64_t tokens = 1024;
  int64_t width = 256;
  int64_t depth = 12;
  int64_t heads = 4;
  int64_t batch = 8;  // shapes per step on each rank
  double dropout = 0.0;
  int64_t steps = 3;  // timed steps per policy (interleaved)
  int64_t warmup = 1;
  std::string policies = "none,blocks,attention,budget";
  double budget_mib = 0;  // 0: half of what policy none stores
  std::string precision = "fp32";
  std::string device = "auto";
  uint64_t seed = 0;
  double timeout_s = 3600;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void validate(const DiffusionBenchOptions& o) {
  auto fail = [](const std::string& what) { throw UserError("bench diffusion: " + what); };
  if (o.width % o.heads != 0) fail("--width must be a multiple of --heads");
  const std::vector<std::string> policies = split_list(o.policies);
  if (policies.empty() || policies.front() != "none")
    fail("--policies must start with none, the baseline of the ratios (got '" + o.policies + "')");
  for (const std::string& p : policies) parse_recompute_policy(p);
  if (o.budget_mib < 0) fail("--budget-mib must be >= 0");
  if (o.dropout < 0 || o.dropout > 0.9) fail("--dropout must be in [0, 0.9] (diffusion.dropout)");
}

// The config of the bench's run: the model of the flags, `batch` shapes per rank, on `shapes`.
Config bench_config(const DiffusionBenchOptions& o, const std::string& shapes, int ranks,
                    int64_t steps) {
  auto set = [](const char* key, const auto& value) {
    std::ostringstream text;
    text << key << "=" << value;
    return text.str();
  };
  return parse_config(std::string("[model]\nname = \"") + kModelName + "\"\n", "bench diffusion",
                      {"data.path=" + shapes, set("run.seed", o.seed), set("train.steps", steps),
                       "train.precision=" + o.precision, set("diffusion.width", o.width),
                       set("diffusion.depth", o.depth), set("diffusion.heads", o.heads),
                       set("diffusion.tokens", o.tokens), set("diffusion.batch", o.batch * ranks),
                       set("diffusion.dropout", o.dropout), "diffusion.generative_eval=false",
                       // A step's time does not depend on its learning rate; a bench's few steps
                       // would not fit the default warm-up.
                       "diffusion.lr_schedule=constant", "diffusion.warmup_steps=0"});
}

struct Case {
  std::string policy;
  Recompute recompute;
  std::vector<double> times;
  int64_t peak_bytes = 0;  // the allocator's peak during the steps (model, Adam, grads, activations)
  int64_t step_bytes = 0;  // that peak above what was allocated before the step
  int64_t stored_bytes = 0;  // what the forward stores until backward (a dry forward)
  int64_t recomputed_blocks = 0;
};

int run_diffusion_bench(const DiffusionBenchOptions& o) {
  validate(o);
  distributed::ProcessContext context(nullptr, nullptr, o.timeout_s);
  log::init({context.rank(), "warn", "", true});
  const int threads = context.apply_thread_share(0);
  const int rank = context.rank();
  const torch::Device device = bench::bench_device(context, o.device, "diffusion");
  if (o.precision == "fp16" && !device.is_cuda())
    throw UserError("bench diffusion --precision fp16 needs CUDA (bf16 runs on the CPU too)");

  // A shape set for the batches (each rank writes its own), enough shapes that the train split
  // fills a batch.
  bench::TempDir temp("diffusion");
  data::shapes::GenerateOptions generate;
  generate.count = std::max<int64_t>(data::shapes::kMinCount, 2 * o.batch * context.size());
  generate.points = std::max<int64_t>(o.tokens, data::shapes::kMinPoints);
  generate.seed = o.seed;
  const std::string shapes_path = (temp.path / "shapes.h5").string();
  data::shapes::write_generated_shapes(generate, shapes_path);
  const data::shapes::ShapesReader shapes(shapes_path);
  const int64_t cases_count = static_cast<int64_t>(split_list(o.policies).size());
  FamilyRegistry families;  // makes [diffusion] known to the config
  register_diffusion_family(families);
  const Config config =
      bench_config(o, shapes_path, context.size(), (o.warmup + o.steps) * cases_count);
  auto comm = distributed::make_communicator(context, "auto", device);
  DiffusionFamily family(FamilyContext{config, context, *comm, shapes, device});
  RunOptions run_options;
  run_options.steps = config.train.steps;
  run_options.seed = static_cast<uint64_t>(config.run.seed);
  run_options.precision = o.precision;
  run_options.progress = false;
  run_options.not_learning_steps = 0;
  TrainingRun run(context, *comm, family, shapes, run_options);
  const PointDenoiser& model = family.model();
  int64_t step = 0;
  // One training step as a run takes it (the family's forward and backward with the DDPM loss,
  // the gradient allreduce, the agreed non-finite check and Adam) under `recompute`.
  auto train_step = [&](const Recompute& recompute) {
    family.set_recompute(recompute);
    run.train_step(step++);
  };
  bench::progress(rank, "diffusion",
                  "%lld parameters (width %lld, depth %lld, heads %lld), %lld shapes x %lld "
                  "tokens per rank, %s on %s, %d CPU threads per rank",
                  static_cast<long long>(model.parameter_count()), static_cast<long long>(o.width),
                  static_cast<long long>(o.depth), static_cast<long long>(o.heads),
                  static_cast<long long>(o.batch), static_cast<long long>(o.tokens),
                  o.precision.c_str(), device.str().c_str(), threads);
  std::vector<Case> cases;
  const SegmentInfo block = family.measure_block(o.precision);
  for (const std::string& policy : split_list(o.policies)) {
    Case c;
    c.policy = policy;
    switch (parse_recompute_policy(policy)) {
      case RecomputePolicy::None: break;
      case RecomputePolicy::Attention: c.recompute.attention = true; break;
      case RecomputePolicy::Blocks: c.recompute.blocks.assign(o.depth, true); break;
      case RecomputePolicy::Budget: {
        // Default: what recomputing half of the blocks stores.
        const int64_t half = o.depth / 2;
        const double budget =
            o.budget_mib > 0 ? o.budget_mib
                             : static_cast<double>((o.depth - half) * block.activation_bytes +
                                                   half * block.boundary_bytes) /
                                   (1024.0 * 1024.0);
        c.policy = "budget";
        c.recompute.blocks = plan_block_budget(block, o.depth, budget).checkpointed;
        break;
      }
    }
    for (const bool b : c.recompute.blocks) c.recomputed_blocks += b ? 1 : 0;
    family.set_recompute(c.recompute);
    c.stored_bytes = family.measure_activation_bytes(o.precision);
    cases.push_back(std::move(c));
  }
  // Adam's state exists from the first step on: warm up first, then interleave the policies so
  // that drift of the machine's speed hits them alike.
  for (int64_t w = 0; w < o.warmup; ++w)
    for (Case& c : cases) {
      train_step(c.recompute);
      bench::progress(rank, "diffusion", "warm-up %lld, %s", static_cast<long long>(w + 1),
                      c.policy.c_str());
    }
  for (int64_t s = 0; s < o.steps; ++s) {
    for (Case& c : cases) {
      bench::sync(device);
      MPI_CHECK(MPI_Barrier(context.world()));
      const int64_t before = memory_stats(device).current_bytes;
      reset_peak(device);
      const auto start = std::chrono::steady_clock::now();
      train_step(c.recompute);
      bench::sync(device);
      const double seconds = bench::max_over_ranks(
          context.world(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      const MemoryStats m = memory_stats(device);
      c.times.push_back(seconds);
      c.peak_bytes = std::max(c.peak_bytes, m.peak_bytes);
      c.step_bytes = std::max(c.step_bytes, m.peak_bytes - before);
      bench::progress(rank, "diffusion", "step %lld, %s: %.3f s, peak %s",
                      static_cast<long long>(s + 1), c.policy.c_str(), seconds,
                      format_bytes(m.peak_bytes).c_str());
    }
  }
  const Case& base = cases.front();
  const double base_s = bench::median(base.times);
  for (const Case& c : cases) {
    const double peak = bench::max_over_ranks(context.world(), static_cast<double>(c.peak_bytes));
    const double base_peak =
        bench::max_over_ranks(context.world(), static_cast<double>(base.peak_bytes));
    const double step_s = bench::median(c.times);
    if (rank != 0) continue;
    std::printf("{\"bench\":\"diffusion\",\"policy\":\"%s\",\"tokens\":%lld,\"width\":%lld,"
                "\"depth\":%lld,\"heads\":%lld,\"batch\":%lld,\"dropout\":%g,\"precision\":\"%s\","
                "\"device\":\"%s\",\"recomputed_blocks\":%lld,\"step_s\":%.6g,"
                "\"peak_bytes\":%lld,\"step_bytes\":%lld,\"stored_bytes\":%lld,"
                "\"time_ratio\":%.4f,\"peak_ratio\":%.4f,\"step_bytes_ratio\":%.4f,"
                "\"stored_ratio\":%.4f,\"parameters\":%lld,\"steps\":%lld}\n",
                c.policy.c_str(), static_cast<long long>(o.tokens),
                static_cast<long long>(o.width), static_cast<long long>(o.depth),
                static_cast<long long>(o.heads), static_cast<long long>(o.batch), o.dropout,
                o.precision.c_str(), device.is_cuda() ? "cuda" : "cpu",
                static_cast<long long>(c.recomputed_blocks), step_s,
                static_cast<long long>(peak), static_cast<long long>(c.step_bytes),
                static_cast<long long>(c.stored_bytes), step_s / base_s, peak / base_peak,
                static_cast<double>(c.step_bytes) / static_cast<double>(base.step_bytes),
                static_cast<double>(c.stored_bytes) / static_cast<double>(base.stored_bytes),
                static_cast<long long>(model.parameter_count()),
                static_cast<long long>(o.steps));
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace

bench::BenchCommand add_diffusion_bench(CLI::App& bench) {
  auto o = std::make_shared<DiffusionBenchOptions>();
  CLI::App* sub = bench.add_subcommand(
      "diffusion",
      "Memory and time of a point-diffusion training step (forward, DDPM loss, backward, "
      "gradient allreduce, Adam: the family's step as a run takes it) under each checkpoint "
      "policy, on synthetic shapes, each rank on its share of the batch. One JSON line "
      "per policy on rank 0's stdout: policy, tokens, width, depth, heads, batch, "
      "recomputed_blocks, step_s (median of the timed steps, slowest rank), peak_bytes (the "
      "allocator's peak during a step: parameters, Adam state, gradients and activations), "
      "step_bytes (that peak above what was allocated before the step), stored_bytes (what the "
      "forward keeps for backward, on a dry forward), and each one's ratio against policy none "
      "of the same run (time_ratio, peak_ratio, step_bytes_ratio, stored_ratio). Progress on "
      "stderr.");
  sub->add_option("--tokens", o->tokens, "Points per cloud (one token each)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--width", o->width, "Transformer width")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{8}, int64_t{8192}));
  sub->add_option("--depth", o->depth, "Transformer blocks")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  sub->add_option("--heads", o->heads, "Attention heads (divides --width)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  sub->add_option("--batch", o->batch, "Clouds per step on each rank (diffusion.batch = this x ranks)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  sub->add_option("--dropout", o->dropout,
                  "Dropout in the blocks; above 0, attention on the CPU takes the unfused path "
                  "that keeps the tokens x tokens softmax for backward")
      ->capture_default_str();
  sub->add_option("--steps", o->steps, "Timed steps per policy (interleaved across policies)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  sub->add_option("--warmup", o->warmup, "Untimed steps per policy first")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1000}));
  sub->add_option("--policies", o->policies,
                  "Comma-separated checkpoint policies, none first (the baseline): none, blocks, "
                  "attention, budget")
      ->capture_default_str();
  sub->add_option("--budget-mib", o->budget_mib,
                  "The budget policy's activation budget in MiB (default: what recomputing half "
                  "of the blocks stores)")
      ->capture_default_str();
  sub->add_option("--precision", o->precision, "fp32, bf16 (CPU and CUDA) or fp16 (CUDA)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_option("--device", o->device,
                  "auto (CUDA when every rank has a device of its own), cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--seed", o->seed, "Seed of the parameters and the clouds")->capture_default_str();
  sub->add_option("--timeout", o->timeout_s,
                  "Seconds a rank may wait in one collective before the job is aborted (exit 3)")
      ->capture_default_str();
  return {sub, [o] { return run_diffusion_bench(*o); }};
}

}  // namespace tessera::models::diffusion
