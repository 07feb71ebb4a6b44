// Trainer::run and its output: the progress line on stderr, RUN_DIR/metrics.jsonl (one JSON
// object per logged step) and the final summary; files are written by rank 0 only.
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "distributed/errors.h"
#include "framework/learning_check.h"
#include "framework/log.h"
#include "framework/memory.h"
#include "framework/snapshot.h"
#include "framework/trainer.h"
#include "framework/trainer_run.h"

namespace tessera {

namespace {

std::string format_rate(double rays_per_s) {
  char text[32];
  if (rays_per_s >= 1e6) std::snprintf(text, sizeof(text), "%.2fM", rays_per_s / 1e6);
  else if (rays_per_s >= 1e3) std::snprintf(text, sizeof(text), "%.1fk", rays_per_s / 1e3);
  else std::snprintf(text, sizeof(text), "%.0f", rays_per_s);
  return text;
}

// PSNR of a mean squared error of values in [0, 1].
double psnr_of_mse(double mse) { return mse > 0 ? -10.0 * std::log10(mse) : 99.0; }

}  // namespace

void Trainer::open_metrics() {
  // A resumed run keeps its records up to the snapshot's step (trainer_run.h).
  metrics_ = open_metrics_log(options_.out_dir, comm_.rank(), steps_done_);
}

TrainSummary Trainer::run() {
  StopSignals signals;
  open_metrics();
  TrainSummary summary;
  const auto run_start = std::chrono::steady_clock::now();
  auto window_start = run_start;
  int64_t window_steps = 0;
  StepResult last;
  EvalResult eval;
  bool evaluated = false;
  const bool snapshots = !options_.out_dir.empty();
  const int64_t first = steps_done_;
  const int64_t until = options_.stop_after >= 0 ? std::min(options_.stop_after, options_.steps)
                                                 : options_.steps;
  int64_t snapshot_step = -1;
  bool stopped_by_signal = false;
  LearningCheck learning(options_.not_learning_steps, "nerf");
  for (int64_t step = first; step < until; ++step) {
    last = train_step(step);
    ++window_steps;
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
          (newest ? "The last good snapshot is " + *newest + "; resume from it with a lower " +
                        "train.lr or with precision = \"fp32\""
                  : std::string("No snapshot was written; lower train.lr")));
    }
    // One small allreduce per step: did any rank receive SIGTERM or SIGINT?
    stopped_by_signal = agree_stop(comm_);
    const bool final_step = done == options_.steps;
    const bool do_eval = final_step || (options_.eval_every > 0 && done % options_.eval_every == 0);
    const bool do_log = final_step || do_eval || stopped_by_signal || done == until ||
                        (options_.log_every > 0 && done % options_.log_every == 0);
    if (do_log) {
      const auto now = std::chrono::steady_clock::now();
      const double window_s = std::chrono::duration<double>(now - window_start).count();
      const double rays_per_s = window_s > 0 ? window_steps * options_.rays_per_step / window_s : 0.0;
      if (do_eval) {
        eval = evaluate(done);
        evaluated = true;
      }
      log_step(last, do_eval ? &eval : nullptr, rays_per_s);
    }
    if (snapshots && snapshot_due(done, until, options_.snapshot_every, stopped_by_signal)) {
      summary.last_snapshot = save_snapshot();
      snapshot_step = done;
    }
    if (do_log) {
      window_start = std::chrono::steady_clock::now();  // eval and snapshot time not in rays/s
      window_steps = 0;
    }
    if (stopped_by_signal) {
      report_stopped_by_signal(comm_.rank(), done, summary.last_snapshot);
      break;
    }
  }
  if (snapshots && snapshot_step != steps_done_ && steps_done_ > first)
    summary.last_snapshot = save_snapshot();
  summary.steps = steps_done_;
  summary.finished = steps_done_ == options_.steps;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  summary.final_loss = last.loss;
  summary.rays_per_s = summary.seconds > 0
                           ? (steps_done_ - first) * options_.rays_per_step / summary.seconds
                           : 0.0;
  if (evaluated) {
    summary.eval_psnr = eval.psnr;
    summary.eval_ssim = eval.ssim;
    summary.eval_views = eval.views;
  }
  summary.skipped_steps = scaler_->skipped_steps();
  summary.peak_mem_bytes = memory_stats(device_).peak_bytes;
  write_summary(summary);
  return summary;
}

void Trainer::log_step(const StepResult& r, const EvalResult* eval, double rays_per_s) {
  // The job's peak: the largest of the ranks' peaks (collective; every rank logs the same steps).
  torch::Tensor peak = torch::tensor({memory_stats(device_).peak_bytes},
                                     torch::TensorOptions().dtype(torch::kInt64).device(comm_.device()));
  comm_.allreduce(peak, distributed::ReduceOp::Max);
  const int64_t peak_bytes = peak.item<int64_t>();
  if (comm_.rank() != 0) return;
  const int64_t done = r.step + 1;
  const double psnr = psnr_of_mse(r.loss);
  if (metrics_.is_open()) {
    nlohmann::json j;
    j["step"] = done;
    j["loss"] = r.loss;
    j["psnr"] = psnr;
    j["lr"] = r.lr;
    j["sampling_rate"] = r.sampling_rate;
    j["loss_scale"] = r.loss_scale;
    j["skipped"] = r.skipped;
    j["rays_per_s"] = rays_per_s;
    j["samples_per_ray"] = r.samples_per_ray;
    j["rendered_per_ray"] = r.rendered_per_ray;
    j["peak_mem_bytes"] = peak_bytes;
    if (eval) {
      j["eval_psnr"] = eval->psnr;
      j["eval_ssim"] = eval->ssim;
      j["eval_views"] = eval->views;
    }
    metrics_ << j.dump() << '\n';
    metrics_.flush();
  }
  if (!options_.progress) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = done > 0 ? elapsed / done * (options_.steps - done) : 0.0;
  char line[256];
  std::snprintf(line, sizeof(line),
                "step %lld/%lld loss %.5f psnr %.1f rays/s %s spr %.0f/%.0f mem %lld MiB rate %.2f lr %.1e "
                "eta %s",
                static_cast<long long>(done), static_cast<long long>(options_.steps), r.loss, psnr,
                format_rate(rays_per_s).c_str(), r.rendered_per_ray, r.samples_per_ray,
                static_cast<long long>(peak_bytes >> 20),
                r.sampling_rate, r.lr, log::format_duration(eta).c_str());
  std::string text = line;
  if (eval && eval->views > 0) {
    char extra[96];
    std::snprintf(extra, sizeof(extra), " | eval psnr %.2f ssim %.4f (%lld views)", eval->psnr,
                  eval->ssim, static_cast<long long>(eval->views));
    text += extra;
  }
  std::fprintf(stderr, "%s\n", text.c_str());
  spdlog::debug("{}", text);
}

void Trainer::write_summary(const TrainSummary& s) {
  if (comm_.rank() != 0) return;
  char line[320];
  std::snprintf(line, sizeof(line),
                "%s: %lld steps in %s, final loss %.5f (psnr %.2f), %s rays/s, eval psnr %.2f "
                "ssim %.4f (%lld views), %lld skipped steps, peak memory %s",
                s.finished ? "done" : "stopped", static_cast<long long>(s.steps),
                log::format_duration(s.seconds).c_str(), s.final_loss,
                psnr_of_mse(s.final_loss), format_rate(s.rays_per_s).c_str(), s.eval_psnr,
                s.eval_ssim, static_cast<long long>(s.eval_views),
                static_cast<long long>(s.skipped_steps), format_bytes(s.peak_mem_bytes).c_str());
  if (options_.progress) std::fprintf(stderr, "%s\n", line);
  spdlog::debug("{}", line);
  if (metrics_.is_open()) {
    nlohmann::json j;
    j["summary"] = true;
    j["steps"] = s.steps;
    j["finished"] = s.finished;
    j["last_snapshot"] = s.last_snapshot;
    j["seconds"] = s.seconds;
    j["final_loss"] = s.final_loss;
    j["rays_per_s"] = s.rays_per_s;
    j["eval_psnr"] = s.eval_psnr;
    j["eval_ssim"] = s.eval_ssim;
    j["skipped_steps"] = s.skipped_steps;
    j["peak_mem_bytes"] = s.peak_mem_bytes;
    metrics_ << j.dump() << '\n';
    metrics_.flush();
  }
}

}  // namespace tessera
