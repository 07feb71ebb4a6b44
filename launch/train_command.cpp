// `tessera train CONFIG`: loads and validates the config (before MPI starts, so bad input is
// reported once), prints it on request, then starts the run of the configured model family.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "distributed/errors.h"
#include "framework/config.h"
#include "framework/family.h"
#include "framework/log.h"
#include "framework/session.h"
#include "framework/trainer_run.h"
#include "launch/commands.h"
#include "models/builtin.h"

namespace tessera::launch {

namespace {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string log_level;
  bool verbose = false;    // run.verbose = true
  bool print_config = false;
  std::string resume;      // "", "auto" or a snapshot path
  int64_t until = -1;      // stop after this step (snapshot written); -1 = train.steps
};

int run_train(const TrainOptions& options) {
  // From here on SIGTERM, SIGINT and SIGUSR1 only ask the ranks to stop (framework/trainer_run.h):
  // one arriving during start-up, resume or a snapshot write is acted on at the next agreement.
  const StopSignals signals;
  std::vector<std::string> overrides = options.overrides;
  if (!options.log_level.empty()) overrides.push_back("run.log_level=" + options.log_level);
  if (options.verbose) overrides.push_back("run.verbose=true");
  FamilyRegistry families;  // before the config: the families' sections are part of its schema
  models::register_builtin_families(families);
  const Config config = load_config(options.config_path, overrides);
  if (options.print_config) {
    if (launcher_rank() == 0) std::cout << to_toml(config) << std::flush;
    return kExitOk;
  }
  TrainRequest request;
  request.config_path = options.config_path;
  request.resume = options.resume;
  request.until = options.until;
  TrainSummary summary;
  {
    Session session = start_training(config, families, request);
    summary = session.run->run();  // prints and records the summary on rank 0
  }  // MPI is finalized here, at about the same moment on every rank
  if (summary.stopped_by_signal) {
    // Leave at once, skipping the libraries' teardown (hundreds of ms, different on each rank):
    // under `srun --kill-on-bad-exit` the first rank to exit with 4 gets the others killed, and
    // one killed in its teardown turned the job's exit code into 143 instead of 4.
    log::flush();
    std::fflush(nullptr);
    std::_Exit(kExitStopped);
  }
  return kExitOk;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand("train", "Train a scene from a TOML config (run under mpirun "
                                              "for several ranks)");
  sub->add_option("config", options->config_path, "TOML config file (see docs/config.md)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--set", options->overrides,
                  "Override a config key: --set section.key=value (a TOML value; a bare word "
                  "such as a path is taken as a string). Repeatable")
      ->type_name("KEY=VALUE");
  sub->add_option("--log-level", options->log_level,
                  "Log level: trace, debug, info, warn or error (default: run.log_level)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  sub->add_flag("--verbose", options->verbose,
                "The progress line adds this rank's seconds per phase of a step (run.verbose)");
  sub->add_option("--resume", options->resume,
                  "Continue a run from a snapshot: a path, or `auto` for the newest snapshot in "
                  "RUN_DIR/snapshots that validates (damaged ones are skipped with a warning; "
                  "none: start at step 0). The world size may differ from the run's")
      ->type_name("PATH|auto");
  sub->add_option("--until", options->until,
                  "Stop after this step, writing a snapshot, as a time-limited job would "
                  "(continue later with --resume auto). Default: train.steps")
      ->type_name("STEP")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  sub->add_flag("--print-config", options->print_config,
                "Print the resolved config (every key the model reads, defaults filled in) as TOML and exit");
  return {sub, [options] { return run_train(*options); }};
}

Command add_config_reference_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "config-reference", "Print the reference of every config key as Markdown (docs/config.md)");
  return {sub, [] {
            FamilyRegistry families;  // their sections are part of the reference
            models::register_builtin_families(families);
            std::cout << config_reference_markdown();
            return kExitOk;
          }};
}

}  // namespace tessera::launch
