// The `tessera` subcommands: each adds itself to the CLI11 app and returns the function that
// runs it once the command line is parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace tessera::launch {

// A subcommand and the function that runs it, returning the process exit code.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_train_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_config_reference_command(CLI::App& app);
Command add_synth_command(CLI::App& app);    // synth_command.cpp
Command add_convert_command(CLI::App& app);  // convert_command.cpp
Command add_info_command(CLI::App& app);     // info_command.cpp
Command add_eval_command(CLI::App& app);     // snapshot_commands.cpp
Command add_render_command(CLI::App& app);   // snapshot_commands.cpp
Command add_sample_command(CLI::App& app);   // snapshot_commands.cpp
Command add_export_command(CLI::App& app);   // export_command.cpp
Command add_report_command(CLI::App& app);   // report_command.cpp
Command add_plan_command(CLI::App& app);     // bench_command.cpp (the family's plan)

// The multi-line text of `tessera --version`.
std::string version_text();

// This process's rank as the launcher announced it (OMPI, PMI, Slurm), before MPI is up;
// 0 for a plain run. Lets errors found before MPI_Init be printed once, not once per rank.
int launcher_rank();

}  // namespace tessera::launch
