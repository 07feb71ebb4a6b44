// TrainingRun::run and its output: the progress line on stderr, RUN_DIR/metrics.jsonl (one JSON object
// per logged step, then a summary) and the final line; files are written by rank 0 only.
#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/data/whole_file.h"
#include "framework/learning_check.h"
#include "framework/log.h"
#include "framework/memory.h"
#include "framework/run.h"
#include "framework/snapshot.h"
#include "framework/tensorboard/event_file.h"
#include "framework/trainer_run.h"

namespace tessera {

namespace {

std::string format_rate(double per_s) {
  char text[32];
  if (per_s >= 1e6) std::snprintf(text, sizeof(text), "%.2fM", per_s / 1e6);
  else if (per_s >= 1e3) std::snprintf(text, sizeof(text), "%.1fk", per_s / 1e3);
  else if (per_s >= 10) std::snprintf(text, sizeof(text), "%.0f", per_s);
  else std::snprintf(text, sizeof(text), "%.2f", per_s);
  return text;
}

// "project 12ms sh 4ms ... (412ms)": seconds per phase and their sum, in milliseconds.
std::string format_phases(const PhaseTimes& phases) {
  std::string text;
  double total = 0;
  char item[64];
  for (const auto& [phase, seconds] : phases) {
    std::snprintf(item, sizeof(item), "%s%s %.0fms", text.empty() ? "" : " ", phase.c_str(),
                  seconds * 1e3);
    text += item;
    total += seconds;
  }
  std::snprintf(item, sizeof(item), " (%.0fms)", total * 1e3);
  return text + item;
}

}  // namespace

TrainSummary TrainingRun::run() {
  StopSignals signals;
  // A resumed run keeps its records up to the snapshot's step (trainer_run.h).
  metrics_ = open_metrics_log(options_.out_dir, comm_.rank(), steps_done_);
  if (!options_.out_dir.empty() && comm_.rank() == 0 && !options_.config_toml.empty())
    write_config_copy();
  if (options_.tensorboard && !options_.out_dir.empty() && comm_.rank() == 0) {
    tensorboard_ = std::make_unique<TensorBoardEventFile>(
        (std::filesystem::path(options_.out_dir) / "tensorboard").string(), steps_done_);
    if (!options_.config_toml.empty())
      tensorboard_->text("config", steps_done_, "```toml\n" + options_.config_toml + "\n```");
  }
  TrainSummary summary;
  const auto run_start = std::chrono::steady_clock::now();
  start_ = run_start;
  auto window_start = run_start;
  int64_t window_steps = 0;
  double window_work = 0.0, run_work = 0.0;
  StepRecord last;
  PhaseTimes window_phases;  // summed over the window's steps
  EvalScores eval;
  bool evaluated = false;
  const bool snapshots = !options_.out_dir.empty();
  const int64_t first = steps_done_;
  first_step_ = first;
  int64_t until = options_.stop_after >= 0 ? std::min(options_.stop_after, options_.steps)
                                           : options_.steps;
  int64_t snapshot_step = -1;
  bool stopped_by_signal = false;
  family_.on_start(first);
  start_budget(first);
  LearningCheck learning(options_.not_learning_steps, family_.not_learning_causes());
  // A signal that arrived during start-up or resume (`tessera train` catches them from before
  // MPI starts): stop before the first step, with the snapshot of this step (a resumed run's is
  // written again, to the same bytes).
  if (first < until && agree_stop(comm_)) {
    stopped_by_signal = true;
    if (snapshots) summary.last_snapshot = save_snapshot();
    report_stopped_by_signal(comm_.rank(), first, summary.last_snapshot, family_.stopped_hint());
  }
  for (int64_t step = first; step < until && !stopped_by_signal; ++step) {
    const double step_start = now();
    last = train_step(step);
    // A time budget may plan fewer (or, up to its cap, more) steps, or end the run here.
    budget_step(step, now() - step_start);
    until = options_.stop_after >= 0 ? std::min(options_.stop_after, options_.steps)
                                     : options_.steps;
    for (const auto& [phase, seconds] : last.phases) {
      add_phase(window_phases, phase, seconds);
      add_phase(run_phases_, phase, seconds);
    }
    ++run_phase_steps_;
    ++window_steps;
    window_work += last.work;
    run_work += last.work;
    if (const auto warning = learning.observe(step, last.loss); warning && comm_.rank() == 0)
      spdlog::warn("step {}: {}", step + 1, *warning);
    const int64_t done = step + 1;
    if (consecutive_skips_ >= options_.max_skipped_steps) {
      const auto newest =
          snapshots ? find_latest_snapshot(run_snapshot_dir(options_.out_dir)) : std::nullopt;
      throw std::runtime_error(
          "training stopped at step " + std::to_string(done) + ": the last " +
          std::to_string(consecutive_skips_) + " steps had a non-finite loss or gradient and " +
          "were skipped on every rank (train.max_skipped_steps). " +
          (newest ? "The last good snapshot is " + *newest + "; resume from it with lower " +
                        "learning rates or with precision = \"fp32\""
                  : std::string("No snapshot was written; lower the learning rates")));
    }
    // One small allreduce per step: did any rank receive SIGTERM or SIGINT?
    stopped_by_signal = agree_stop(comm_);
    const bool final_step = done == options_.steps;
    const bool do_eval = final_step || (options_.eval_every > 0 && done % options_.eval_every == 0);
    const bool do_log = final_step || do_eval || stopped_by_signal || done == until ||
                        (options_.log_every > 0 && done % options_.log_every == 0);
    if (do_log) {
      const double window_s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                            window_start).count();
      const double work_per_s = window_s > 0 ? window_work / window_s : 0.0;
      const double steps_per_s = window_s > 0 ? window_steps / window_s : 0.0;
      if (do_eval) {
        eval = evaluate(done);
        evaluated = true;
      }
      PhaseTimes phases = window_phases;
      for (auto& [phase, seconds] : phases) seconds /= static_cast<double>(window_steps);
      log_step(last, phases, do_eval ? &eval : nullptr, work_per_s, steps_per_s);
    }
    if (snapshots && snapshot_due(done, until, options_.snapshot_every, stopped_by_signal)) {
      summary.last_snapshot = save_snapshot();
      snapshot_step = done;
    }
    if (do_log) {
      window_start = std::chrono::steady_clock::now();  // eval and snapshot time not in rates
      window_steps = 0;
      window_work = 0.0;
      window_phases.clear();
    }
    if (stopped_by_signal) {
      report_stopped_by_signal(comm_.rank(), done, summary.last_snapshot, family_.stopped_hint());
      break;
    }
  }
  if (snapshots && snapshot_step != steps_done_ && steps_done_ > first)
    summary.last_snapshot = save_snapshot();
  summary.steps = steps_done_;
  summary.finished = steps_done_ == options_.steps;
  summary.stopped_by_signal = stopped_by_signal;
  // The family's own files of a finished run (a stopped one has its snapshot).
  const std::string outputs =
      summary.finished && snapshots ? family_.write_outputs(options_.out_dir) : "";
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  summary.final_loss = last.loss;
  summary.work_per_s = summary.seconds > 0 ? run_work / summary.seconds : 0.0;
  if (evaluated) summary.eval = eval;
  summary.skipped_steps = scaler_->skipped_steps();
  summary.peak_mem_bytes = memory_stats(comm_.device()).peak_bytes;
  write_summary(summary, outputs);
  return summary;
}

void TrainingRun::log_step(const StepRecord& r, const PhaseTimes& phases, const EvalScores* eval,
                           double work_per_s, double steps_per_s) {
  // The job's peak: the largest of the ranks' peaks (collective; every rank logs the same steps).
  torch::Tensor peak = torch::tensor({memory_stats(comm_.device()).peak_bytes},
                                     torch::TensorOptions().dtype(torch::kInt64).device(comm_.device()));
  comm_.allreduce(peak, distributed::ReduceOp::Max);
  const int64_t peak_bytes = peak.item<int64_t>();
  const int64_t done = r.step + 1;
  write_ranks(done);
  if (comm_.rank() != 0) return;
  const std::string unit = family_.work_unit();
  if (metrics_.is_open() || tensorboard_) {
    nlohmann::json j;
    j["step"] = done;
    j["planned_steps"] = options_.steps;
    j["loss"] = r.loss;
    for (const auto& [key, value] : r.fields.items()) j[key] = value;
    j["loss_scale"] = r.loss_scale;
    j["skipped"] = r.skipped;
    j[unit + "_per_s"] = work_per_s;
    j["steps_per_s"] = steps_per_s;
    j["peak_mem_bytes"] = peak_bytes;
    if (!phases.empty()) {
      nlohmann::json p = nlohmann::json::object();
      for (const auto& [phase, seconds] : phases) p[phase] = seconds;
      j["phase_s"] = p;
    }
    if (eval) j.update(eval->to_json("eval_"));
    if (metrics_.is_open()) {
      metrics_ << j.dump() << '\n';
      metrics_.flush();
    }
    if (tensorboard_) {
      j.erase("step");  // the x axis
      tensorboard_->scalars(j, done);
    }
  }
  if (!options_.progress) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t run_steps = done - first_step_;
  const double eta = run_steps > 0 ? elapsed / run_steps * (options_.steps - done) : 0.0;
  char head[96], tail[128];
  std::snprintf(head, sizeof(head), "step %lld/%lld loss %.5f", static_cast<long long>(done),
                static_cast<long long>(options_.steps), r.loss);
  std::snprintf(tail, sizeof(tail), "%s/s %s mem %lld MiB%s eta %s", unit.c_str(),
                format_rate(work_per_s).c_str(), static_cast<long long>(peak_bytes >> 20),
                r.skipped ? " skipped" : "", log::format_duration(eta).c_str());
  std::string text = std::string(head) + (r.progress.empty() ? "" : " " + r.progress) + " " + tail;
  if (eval && eval->items > 0) text += " | eval " + eval->text();
  if (options_.verbose && !phases.empty()) text += " | " + format_phases(phases);
  std::fprintf(stderr, "%s\n", text.c_str());
  spdlog::debug("{}", text);
}

void TrainingRun::write_config_copy() {
  try {  // the run report's copy: a failure warns, training goes on
    data::write_whole_file((std::filesystem::path(options_.out_dir) / "config.toml").string(),
                           options_.config_toml, "config copy");
  } catch (const UserError& e) {
    spdlog::warn("{}", e.what());
  }
}

void TrainingRun::write_ranks(int64_t done) {
  if (options_.out_dir.empty()) return;
  const MemoryStats memory = memory_stats(comm_.device());
  const distributed::ProcessInfo& info = context_.info();
  nlohmann::json mine;
  mine["rank"] = comm_.rank();
  mine["host"] = info.hostname;
  mine["device"] = comm_.device().str();
  mine["threads"] = at::get_num_threads();
  mine["peak_mem_bytes"] = memory.available ? memory.peak_bytes : -1;
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& [kind, bytes] : family_.memory_parts()) parts.push_back({kind, bytes});
  mine["memory"] = parts;
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [phase, seconds] : run_phases_)
    phases[phase] = seconds / static_cast<double>(std::max<int64_t>(run_phase_steps_, 1));
  mine["phase_s"] = phases;
  mine["phase_steps"] = run_phase_steps_;
  const auto all = distributed::gather_strings(context_, mine.dump(), 0);
  if (comm_.rank() != 0) return;
  nlohmann::json j;
  j["step"] = done;
  j["world_size"] = comm_.size();
  j["backend"] = distributed::to_string(comm_.backend());
  j["ranks"] = nlohmann::json::array();
  for (const auto& text : all) j["ranks"].push_back(nlohmann::json::parse(text));
  try {  // a failure warns, training goes on
    data::write_whole_file((std::filesystem::path(options_.out_dir) / "ranks.json").string(),
                           j.dump(1) + "\n", "ranks file");
  } catch (const UserError& e) {
    spdlog::warn("{}; the run report will lack the ranks' memory and phases", e.what());
  }
}

void TrainingRun::write_summary(const TrainSummary& s, const std::string& outputs) {
  const std::string described = family_.describe();       // collective
  const nlohmann::json fields = family_.summary_fields();  // collective
  if (comm_.rank() != 0) return;
  const std::string unit = family_.work_unit();
  char line[320];
  std::snprintf(line, sizeof(line),
                "%s: %lld steps in %s, final loss %.5f, %s %s/s, eval %s, %lld skipped steps, "
                "peak memory %s",
                s.finished ? "done" : "stopped", static_cast<long long>(s.steps),
                log::format_duration(s.seconds).c_str(), s.final_loss,
                format_rate(s.work_per_s).c_str(), unit.c_str(), s.eval.text().c_str(),
                static_cast<long long>(s.skipped_steps), format_bytes(s.peak_mem_bytes).c_str());
  std::string text = line;
  if (!described.empty()) text += ", " + described;
  if (!outputs.empty()) text += ", " + outputs;
  else if (!s.finished && !s.last_snapshot.empty()) text += ", snapshot " + s.last_snapshot;
  if (options_.progress) std::fprintf(stderr, "%s\n", text.c_str());
  spdlog::debug("{}", text);
  if (metrics_.is_open()) {
    nlohmann::json j;
    j["summary"] = true;
    j["steps"] = s.steps;
    j["planned_steps"] = options_.steps;
    j["finished"] = s.finished;
    j["stopped_by_signal"] = s.stopped_by_signal;
    j["last_snapshot"] = s.last_snapshot;
    j["seconds"] = s.seconds;
    j["final_loss"] = s.final_loss;
    j[unit + "_per_s"] = s.work_per_s;
    j.update(s.eval.to_json("eval_"));
    j["skipped_steps"] = s.skipped_steps;
    j["peak_mem_bytes"] = s.peak_mem_bytes;
    for (const auto& [key, value] : fields.items()) j[key] = value;
    metrics_ << j.dump() << '\n';
    metrics_.flush();
  }
}

}  // namespace tessera
