// Pieces of the TrainingRun (framework/trainer_run.h): stop signals agreed across ranks,
// metrics.jsonl kept up to a resumed step, snapshot write + rotation, snapshot checks.
#include "framework/trainer_run.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "distributed/errors.h"
#include "framework/snapshot.h"

namespace tessera {

namespace {

std::atomic<int> g_stop_signal{0};
int g_installed = 0;  // nesting depth of StopSignals (main thread only)

extern "C" void tessera_on_stop_signal(int signal) { g_stop_signal.store(signal); }

}  // namespace

StopSignals::StopSignals() {
  if (g_installed++ > 0) return;  // the outer one keeps what arrived before this
  g_stop_signal.store(0);
  struct sigaction action {};
  action.sa_handler = tessera_on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, &old_term_);
  sigaction(SIGINT, &action, &old_int_);
  sigaction(SIGUSR1, &action, &old_usr1_);
}

StopSignals::~StopSignals() {
  if (--g_installed > 0) return;
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGUSR1, &old_usr1_, nullptr);
}

int stop_signal() { return g_stop_signal.load(); }

bool agree_stop(distributed::Communicator& comm) {
  torch::Tensor stop = torch::tensor({static_cast<int64_t>(g_stop_signal.load() != 0)},
                                     torch::TensorOptions().dtype(torch::kInt64).device(comm.device()));
  comm.allreduce(stop, distributed::ReduceOp::Max);
  return stop.item<int64_t>() != 0;
}

void report_stopped_by_signal(int rank, int64_t done, const std::string& snapshot,
                              const std::string& hint) {
  if (rank == 0)
    std::fprintf(stderr, "\nstopped by a signal after step %lld; snapshot %s; continue with "
                 "--resume auto%s\n", static_cast<long long>(done), snapshot.c_str(), hint.c_str());
  spdlog::warn("stopped by signal {} after step {}", g_stop_signal.load(), done);
}

std::ofstream open_metrics_log(const std::string& out_dir, int rank, int64_t resumed_step) {
  std::ofstream metrics;
  if (out_dir.empty() || rank != 0) return metrics;
  const std::string path = (std::filesystem::path(out_dir) / "metrics.jsonl").string();
  std::vector<std::string> kept;
  if (resumed_step > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() <= resumed_step)
        kept.push_back(line);
    }
  }
  metrics.open(path, std::ios::trunc);
  if (!metrics) throw UserError("cannot open " + path + " for writing; check run.out_dir");
  for (const std::string& line : kept) metrics << line << '\n';
  metrics.flush();
  return metrics;
}

std::string run_snapshot_dir(const std::string& out_dir) {
  return (std::filesystem::path(out_dir) / "snapshots").string();
}

bool snapshot_due(int64_t done, int64_t until, int64_t every, bool stopped_by_signal) {
  return stopped_by_signal || done == until || (every > 0 && done % every == 0);
}

std::string write_run_snapshot(distributed::Communicator& comm, const std::string& out_dir,
                               int64_t step, int64_t keep,
                               const std::function<void(const std::string& path)>& write) {
  const std::string dir = run_snapshot_dir(out_dir);
  if (comm.rank() == 0) std::filesystem::create_directories(dir);
  comm.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = snapshot_path(dir, step);
  write(path);
  if (comm.rank() == 0) {
    for (const std::string& gone : rotate_snapshots(dir, static_cast<int>(keep)))
      spdlog::info("snapshot rotation: removed {}", gone);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("snapshot {} written in {:.3f} s", path, seconds);
  return path;
}

void check_snapshot_matches_run(const std::string& path, const SnapshotMeta& meta,
                                const std::string& model, const std::string& dataset_fingerprint,
                                int64_t steps) {
  if (meta.model != model)
    throw UserError(path + ": the snapshot is of model '" + meta.model + "' but the config trains '" +
                    model + "'; resume with the config of that run (its text is stored in "
                    "the snapshot: `tessera info " + path + "`)");
  if (meta.dataset_fingerprint != dataset_fingerprint)
    throw UserError(path + ": the snapshot was trained on another dataset (fingerprint " +
                    meta.dataset_fingerprint + ", this one " + dataset_fingerprint +
                    "); set data.path to the dataset of that run");
  if (meta.step > steps)
    throw UserError(path + ": the snapshot is at step " + std::to_string(meta.step) +
                    ", past train.steps = " + std::to_string(steps));
}

}  // namespace tessera
