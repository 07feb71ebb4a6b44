// `tessera report RUN_DIR`: its flags; framework/report/run_report.h writes the page.
#include <cstdio>
#include <memory>
#include <string>

#include "distributed/errors.h"
#include "framework/memory.h"
#include "framework/report/run_report.h"
#include "launch/commands.h"

namespace tessera::launch {

Command add_report_command(CLI::App& app) {
  auto options = std::make_shared<ReportOptions>();
  CLI::App* sub = app.add_subcommand(
      "report", "Write RUN_DIR/report.html: one self-contained page of a run (no network needed "
                "to view it) with its status, every metrics.jsonl series as a curve, each rank's "
                "peak memory by kind and seconds per phase, eval renders beside the ground truth, "
                "sample point clouds, the logs' warnings and the resolved config. Works on a "
                "finished, stopped or running run; needs no MPI");
  sub->add_option("run_dir", options->run_dir,
                  "The run's folder (run.out_dir): metrics.jsonl, ranks.json, config.toml, "
                  "renders/, samples/ and logs/ are read from it")
      ->required();
  sub->add_option("--out", options->out, "Write the page here instead of RUN_DIR/report.html");
  sub->add_option("--eval-steps", options->eval_steps,
                  "Eval steps whose renders are embedded: the last and earlier ones spread over "
                  "the run")
      ->default_val(options->eval_steps)
      ->check(CLI::Range(int64_t{0}, int64_t{1000}));
  sub->add_option("--views", options->views, "Views embedded per eval step (the first ones)")
      ->default_val(options->views)
      ->check(CLI::Range(int64_t{0}, int64_t{10000}));
  sub->add_option("--samples", options->samples, "Sample point clouds shown (the first ones)")
      ->default_val(options->samples)
      ->check(CLI::Range(int64_t{0}, int64_t{1000}));
  sub->add_option("--sample-points", options->sample_points,
                  "Points drawn of each sample, spread over its points")
      ->default_val(options->sample_points)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--max-records", options->max_records,
                  "metrics.jsonl records drawn: a longer run's are thinned to every k-th record "
                  "(about this many), plus every eval record and the last (0 = all)")
      ->default_val(options->max_records)
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  return {sub, [options] {
            const ReportSummary s = write_run_report(*options);
            const std::string thinned =
                s.records_shown < s.records ? " (" + std::to_string(s.records_shown) + " drawn)" : "";
            std::printf("wrote %s (%s): %lld logged steps%s, %lld eval steps with %lld images, "
                        "%lld samples, %lld ranks; open it in a browser\n",
                        s.path.c_str(), format_bytes(s.bytes).c_str(),
                        static_cast<long long>(s.records), thinned.c_str(),
                        static_cast<long long>(s.eval_steps),
                        static_cast<long long>(s.images), static_cast<long long>(s.samples),
                        static_cast<long long>(s.ranks));
            if (s.skipped_lines > 0)
              std::fprintf(stderr, "report: %lld metrics.jsonl lines were not JSON (a run still "
                           "writing?) and were left out\n", static_cast<long long>(s.skipped_lines));
            return kExitOk;
          }};
}

}  // namespace tessera::launch
