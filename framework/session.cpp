// TrainingRun bring-up for every family: checks before MPI, ranks and logging, the family from the
// registry, resume resolution, and a run restored from a snapshot (framework/session.h).
#include "framework/session.h"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "framework/data/scene.h"
#include "framework/log.h"
#include "framework/memory.h"
#include "framework/snapshot.h"
#include "framework/trainer_run.h"

namespace tessera {

namespace {

// data.path as the model's family reads it: its own kind of dataset, or a tessera-scene.
std::unique_ptr<data::Dataset> open_dataset(const Config& config, const FamilyRegistry& families) {
  const FamilyInfo& family = families.get(config.model.name, config.source_path);
  if (family.open_dataset) return family.open_dataset(config.data.path);
  return std::make_unique<data::SceneReader>(config.data.path);
}

torch::Device rank_device(distributed::ProcessContext& context) {
  return context.one_cuda_device_per_rank()
             ? torch::Device(torch::kCUDA, context.cuda_device_index())
             : torch::Device(torch::kCPU);
}

// The dataset, the ranks, the communicator and the family of `session.config`.
void bring_up(Session& session, const FamilyRegistry& families, const std::string& log_level,
              const std::string& log_dir) {
  const Config& config = session.config;
  session.context = std::make_unique<distributed::ProcessContext>(
      nullptr, nullptr, config.distributed.timeout_s, config.distributed.heartbeat_s);
  log::init({session.context->rank(), log_level, log_dir, true});
  session.context->apply_thread_share(static_cast<int>(config.distributed.threads));
  const torch::Device device = rank_device(*session.context);
  if (device.is_cpu()) install_counting_cpu_allocator();  // peak memory per rank, from the start
  session.comm = distributed::make_communicator(*session.context, config.distributed.backend, device);
  const FamilyInfo& family = families.get(config.model.name, config.source_path);
  session.family = family.create(
      FamilyContext{config, *session.context, *session.comm, *session.dataset, device});
}

// The family's and the run's checks that need no MPI (UserError naming `origin` for an unknown
// model; the device is the CPU unless a GPU is visible).
void check_family_config(const Config& config, const FamilyRegistry& families,
                         const std::string& origin) {
  const FamilyInfo& family = families.get(config.model.name, origin);
  check_run_options(run_options(config), torch::cuda::is_available() ? torch::Device(torch::kCUDA)
                                                                     : torch::Device(torch::kCPU));
  if (family.check_config) family.check_config(config);
}

// For eval and render (`session.config` set): the checks that need no MPI, then the ranks, the
// dataset, the family and a TrainingRun that writes no files. Without autocast: a run trained in
// fp16 on GPUs renders on CPU ranks.
void start_viewing(Session& session, const FamilyRegistry& families, const std::string& origin) {
  session.config.train.precision = "fp32";
  check_family_config(session.config, families, origin);
  session.dataset = open_dataset(session.config, families);
  bring_up(session, families, "warn", "");
  RunOptions options = run_options(session.config);
  options.out_dir = "";  // eval and render write only what they are asked to
  options.progress = false;
  session.run = std::make_unique<TrainingRun>(*session.context, *session.comm, *session.family,
                                              *session.dataset, options);
}

// Under OpenMPI's mpirun, SIGTERM and Ctrl-C reach the ranks only after odls_base_sigkill_timeout
// seconds (default 1), and SIGKILL follows as long after: too soon for a stop snapshot. Says how
// to stop such a job cleanly, unless the timeout was raised (docs/clusters.md, "Signals").
void note_mpirun_kill_delay() {
  if (std::getenv("OMPI_MCA_orte_hnp_uri") == nullptr) return;  // not started by mpirun
  const char* timeout = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  if (timeout != nullptr && std::atoi(timeout) >= 5) return;
  spdlog::info("under mpirun, SIGTERM and Ctrl-C give the ranks {} s before SIGKILL, too little for "
               "a stop snapshot: stop this job with `kill -USR1 <mpirun pid>` (mpirun forwards it "
               "at once), or start mpirun with --mca odls_base_sigkill_timeout 10 (docs/clusters.md)",
               timeout != nullptr ? timeout : "1");
}

}  // namespace

void check_before_ranks(const Config& config, const FamilyRegistry& families,
                        const std::string& resume) {
  families.get(config.model.name, config.source_path);  // an unknown model first
  if (config.data.path.empty())
    throw UserError(config.source_path + ": data.path is empty; make a dataset with `tessera "
                    "synth` or `tessera convert` and set data.path (or --set data.path=FILE)");
  check_family_config(config, families, config.source_path);
  if (!resume.empty() && resume != "auto") {
    // The seal, format and root attributes only: loading verifies each dataset's checksum as it
    // reads it, so the datasets are not verified twice (the seal reads the file here and again
    // when the run loads it).
    try {
      const SnapshotReader probe(resume);
    } catch (const UserError& e) {
      throw UserError(std::string("--resume: ") + e.what() +
                      " (use --resume auto to pick the newest good snapshot of the run)");
    }
  }
}

std::string resolve_resume(const std::string& resume, const std::string& snapshot_dir,
                           distributed::ProcessContext& context) {
  if (resume != "auto") return resume;
  const auto found = find_latest_snapshot(snapshot_dir, [&](const std::string& message) {
    spdlog::warn("--resume auto: skipping {}", message);
    if (context.rank() == 0) std::cerr << "warning: --resume auto: skipping " << message << "\n";
  });
  const std::string path = found.value_or("");
  if (path.empty()) {
    spdlog::info("--resume auto: no snapshot in {}; starting at step 0", snapshot_dir);
    if (context.rank() == 0)
      std::cerr << "--resume auto: no snapshot in " << snapshot_dir << "; starting at step 0\n";
  }
  distributed::check_same_on_all_ranks(context, distributed::fingerprint(path),
                                       "the snapshot chosen by --resume auto (is " + snapshot_dir +
                                       " on a filesystem all ranks share?)");
  return path;
}

Session start_training(const Config& config, const FamilyRegistry& families,
                       const TrainRequest& request) {
  check_before_ranks(config, families, request.resume);
  Session session;
  session.config = config;
  const std::string resolved = to_toml(config);
  session.dataset = open_dataset(config, families);
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(config.run.out_dir) / "logs", ignored);
  bring_up(session, families, config.run.log_level, config.run.out_dir);
  const distributed::ProcessContext& context = *session.context;
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  spdlog::info("tessera train {}: rank {} of {}, local rank {} of {} on {} (from {}), {} CPU "
               "threads, pid {}{}{}",
               request.config_path, context.rank(), context.size(), context.info().local_rank,
               context.info().local_size, context.info().hostname,
               context.info().local_rank_source, at::get_num_threads(), getpid(),
               job != nullptr ? std::string(", Slurm job ") + job : std::string(),
               restarts != nullptr ? std::string(" (requeued ") + restarts + "x)" : std::string());
  if (!context.info().local_rank_warning.empty()) spdlog::warn("{}", context.info().local_rank_warning);
  if (!context.cuda_warning().empty()) spdlog::warn("{}", context.cuda_warning());
  if (context.rank() == 0 && !context.heartbeat_warning().empty())
    spdlog::warn("{}", context.heartbeat_warning());
  if (context.rank() == 0) note_mpirun_kill_delay();
  if (!config.run.out_dir.empty())
    session.lock = std::make_unique<RunDirLock>(*session.context, config.run.out_dir);
  spdlog::info("resolved config:\n{}", resolved);
  distributed::check_same_on_all_ranks(*session.context, distributed::fingerprint(resolved),
                                       "the resolved config (check --set flags and config files)");
  spdlog::info("model {} on {}, dataset {} ({}), backend {}", config.model.name,
               session.comm->device().str(), config.data.path, session.dataset->summary(),
               distributed::to_string(session.comm->backend()));
  RunOptions options = run_options(config);
  options.config_toml = resolved;
  options.stop_after = request.until;
  session.run = std::make_unique<TrainingRun>(*session.context, *session.comm, *session.family,
                                      *session.dataset, options);
  const std::string resume = resolve_resume(request.resume, run_snapshot_dir(config.run.out_dir),
                                            *session.context);
  if (!resume.empty()) {
    session.run->load_snapshot(resume);
    if (session.context->rank() == 0)
      std::cerr << "resuming from " << resume << " at step " << session.run->next_step() << "\n";
  }
  return session;
}

std::string snapshot_argument(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(path, error)) return path;
  const fs::path nested = fs::path(path) / "snapshots";
  const std::string dir = fs::is_directory(nested, error) ? nested.string() : path;
  const auto found = find_latest_snapshot(dir, [](const std::string& message) {
    std::cerr << "warning: skipping " << message << "\n";
  });
  if (!found)
    throw UserError(path + ": no snapshot that validates in " + dir + " (give a snapshot file, "
                    "a run folder or its snapshots/ folder)");
  return *found;
}

Session restore_session(const std::string& snapshot, const std::vector<std::string>& overrides,
                        const FamilyRegistry& families) {
  Session session;
  int64_t step = 0;
  {
    // The reader checks the format here; loading verifies every checksum as it reads.
    const SnapshotReader reader(snapshot);
    step = reader.meta().step;
    session.config =
        parse_stored_config(reader.meta().config_toml, snapshot + " (stored config)", overrides);
  }
  const Config& config = session.config;
  if (config.data.path.empty() || !std::filesystem::exists(config.data.path))
    throw UserError(snapshot + ": its dataset '" + config.data.path + "' is not there; pass "
                    "--set data.path=FILE to point at it");
  start_viewing(session, families, snapshot);
  session.run->load_snapshot(snapshot);
  if (session.run->next_step() != step)
    throw std::logic_error("restore_session: the run is not at the snapshot's step");
  session.step = step;
  return session;
}

Session import_session(const std::string& file, const std::string& scene,
                       const std::vector<std::string>& overrides, const FamilyRegistry& families) {
  if (!std::filesystem::is_regular_file(file)) throw UserError(file + ": no such file");
  if (scene.empty() || !std::filesystem::is_regular_file(scene))
    throw UserError((scene.empty() ? std::string("--scene") : scene) +
                    ": give the dataset whose cameras to render (--scene FILE.h5)");
  std::vector<std::string> settings;
  std::string readers;
  for (const std::string& name : families.names()) {
    const FamilyInfo& family = families.get(name, file);
    if (!family.import_overrides) continue;
    readers += (readers.empty() ? "" : ", ") + name;
    if (settings.empty()) settings = family.import_overrides(file);
  }
  if (settings.empty())
    throw UserError(file + ": no model family reads this file (families that import one: " +
                    (readers.empty() ? std::string("none") : readers) + ")");
  settings.push_back("data.path=" + scene);
  settings.insert(settings.end(), overrides.begin(), overrides.end());
  Session session;
  session.config = parse_config("", file + " (imported)", settings);
  const Config& config = session.config;
  start_viewing(session, families, file);
  session.step = config.train.steps;
  return session;
}

}  // namespace tessera
