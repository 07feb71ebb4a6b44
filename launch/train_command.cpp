// `tessera train CONFIG`: loads and validates the config (before MPI starts, so bad input is
// reported once), prints it on request, then sets up ranks, logging and the model.
#include <filesystem>
#include <iostream>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/config.h"
#include "framework/log.h"
#include "framework/model.h"
#include "launch/commands.h"
#include "models/builtin.h"

namespace tessera::launch {

namespace {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string log_level;
  bool print_config = false;
};

int run_train(const TrainOptions& options) {
  std::vector<std::string> overrides = options.overrides;
  if (!options.log_level.empty()) overrides.push_back("run.log_level=" + options.log_level);
  const Config config = load_config(options.config_path, overrides);
  const std::string resolved = to_toml(config);
  if (options.print_config) {
    if (launcher_rank() == 0) std::cout << resolved << std::flush;
    return kExitOk;
  }
  ModelRegistry registry;
  models::register_builtin_models(registry);
  if (!registry.contains(config.model.name)) registry.create(config);  // throws, listing names

  distributed::ProcessContext context(nullptr, nullptr, config.distributed.timeout_s);
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(config.run.out_dir) / "logs", ignored);
  log::init({context.rank(), config.run.log_level, config.run.out_dir, true});
  const int threads = context.apply_thread_share(static_cast<int>(config.distributed.threads));
  spdlog::info("tessera train {}: {} rank(s), local rank {} of {} on {} (from {}), {} CPU threads",
               options.config_path, context.size(), context.info().local_rank,
               context.info().local_size, context.info().hostname,
               context.info().local_rank_source, threads);
  spdlog::info("resolved config:\n{}", resolved);
  distributed::check_same_on_all_ranks(context, distributed::fingerprint(resolved),
                                       "the resolved config (check --set flags and config files)");
  std::unique_ptr<Model> model = registry.create(config);
  spdlog::info("model {} built", model->name());
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
  sub->add_flag("--print-config", options->print_config,
                "Print the resolved config (every key, defaults filled in) as TOML and exit");
  return {sub, [options] { return run_train(*options); }};
}

Command add_config_reference_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "config-reference", "Print the reference of every config key as Markdown (docs/config.md)");
  return {sub, [] {
            std::cout << config_reference_markdown();
            return kExitOk;
          }};
}

}  // namespace tessera::launch
