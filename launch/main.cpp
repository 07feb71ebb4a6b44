// Entry point of the `tessera` executable: parses the command line and maps every error to
// Tessera's exit codes (0 ok, 2 bad input, 3 distributed failure, 1 anything else).
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <vector>

#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/log.h"
#include "framework/memory.h"
#include "framework/thread_invariance.h"
#include "launch/commands.h"

namespace {

// Reports a failure once and ends this process (or, once MPI runs with peers, the whole job).
int fail(int code, const std::string& message) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (initialized && !finalized && size > 1) {
    // Peers may be waiting in a collective for this rank: end them all, with this code.
    tessera::distributed::ProcessContext::abort_job(code, message);
  }
  tessera::log::flush();
  if (initialized || tessera::launch::launcher_rank() == 0)
    std::fprintf(stderr, "tessera: error: %s\n", message.c_str());
  // A single rank has no peer to wait for: finalize, so that mpirun -np 1 reports our code.
  if (initialized && !finalized) MPI_Finalize();
  return code;
}

int run(int argc, char** argv) {
  CLI::App app{"Tessera: radiance fields (NeRF, 3D Gaussian Splatting) and point-cloud diffusion "
               "trained across many GPUs "
               "and nodes. Launch with mpirun, one rank per GPU.",
               "tessera"};
  app.set_version_flag("--version", &tessera::launch::version_text,
                       "Print the versions of Tessera, LibTorch, CUDA, NCCL, MPI and HDF5");
  app.require_subcommand(1);
  app.fallthrough();
  const std::vector<tessera::launch::Command> commands = {
      tessera::launch::add_train_command(app),
      tessera::launch::add_synth_command(app),
      tessera::launch::add_convert_command(app),
      tessera::launch::add_info_command(app),
      tessera::launch::add_eval_command(app),
      tessera::launch::add_render_command(app),
      tessera::launch::add_sample_command(app),
      tessera::launch::add_export_command(app),
      tessera::launch::add_report_command(app),
      tessera::launch::add_plan_command(app),
      tessera::launch::add_bench_command(app),
      tessera::launch::add_config_reference_command(app),
  };
  // CLI11 would only say that a subcommand is required; name the unknown word instead.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const auto& command : commands) {
      found = found || command.app->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + command.app->get_name();
    }
    if (!found)
      throw tessera::UserError(std::string("unknown command '") + argv[1] + "' (known: " + known +
                               "; see tessera --help)");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (tessera::launch::launcher_rank() == 0) app.exit(e);
    return tessera::kExitBadInput;
  }
  for (const auto& command : commands)
    if (command.app->parsed()) return command.run();
  return tessera::kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::request_reproducible_blas();  // before any GEMM
  tessera::retain_freed_host_memory();
  try {
    return run(argc, argv);
  } catch (const tessera::UserError& e) {
    return fail(tessera::kExitBadInput, e.what());
  } catch (const tessera::DistributedError& e) {
    return fail(tessera::kExitDistributed, e.what());
  } catch (const std::exception& e) {
    return fail(tessera::kExitFailure, e.what());
  }
}
