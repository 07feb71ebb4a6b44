// `tessera bench NAME`: benchmarks that print one JSON object per line on rank 0's stdout, each
// with a baseline measured in the same run. allreduce (Tessera's Communicator vs raw MPI or NCCL
// on the same buffer) and the benches the model families add (models/builtin.cpp).
#include <memory>
#include <vector>

#include "distributed/errors.h"
#include "framework/allreduce_bench.h"
#include "framework/bench_util.h"
#include "launch/commands.h"
#include "models/builtin.h"

namespace tessera::launch {

Command add_bench_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("bench", "Run a benchmark; prints one JSON object per line");
  sub->require_subcommand(1);
  auto options = std::make_shared<bench::AllreduceBenchOptions>();
  CLI::App* allreduce = sub->add_subcommand(
      "allreduce", "Communicator allreduce vs a raw MPI_Allreduce (ncclAllReduce on GPU) of the "
                   "same buffer, for sizes doubling from --min-bytes to --max-bytes");
  allreduce->add_option("--min-bytes", options->min_bytes, "Smallest message in bytes")
      ->capture_default_str();
  allreduce->add_option("--max-bytes", options->max_bytes, "Largest message in bytes")
      ->capture_default_str();
  allreduce->add_option("--iters", options->iters, "Timed iterations per size and method")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  allreduce->add_option("--warmup", options->warmup, "Untimed iterations per size first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  allreduce->add_option("--device", options->device,
                        "auto (CUDA when every rank has a device of its own), cpu (MPI backend) or cuda (NCCL backend)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  // The model families' own benches (models/builtin.cpp).
  const std::vector<bench::BenchCommand> families = models::add_builtin_benches(*sub);
  return {sub, [options, allreduce, families] {
            if (allreduce->parsed()) return bench::run_allreduce_bench(*options);
            for (const bench::BenchCommand& family : families)
              if (family.app->parsed()) return family.run();
            return kExitBadInput;
          }};
}

// `tessera plan`: the gaussians family's capacity plan (models/gaussians/gaussian_plan.h).
Command add_plan_command(CLI::App& app) {
  const bench::BenchCommand plan = models::add_builtin_plan(app);
  return {plan.app, plan.run};
}

}  // namespace tessera::launch
