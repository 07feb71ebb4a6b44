// `tessera train` for model.name = "gaussians": the sharded 3DGS trainer
// (models/gaussians/gaussian_trainer.h) with progress, metrics.jsonl, eval renders, snapshots
// (resume, --until, SIGTERM) and the PLY.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distributed/errors.h"
#include "framework/data/image_io.h"
#include "framework/learning_check.h"
#include "framework/log.h"
#include "framework/memory.h"
#include "framework/metrics.h"
#include "framework/trainer_run.h"
#include "launch/run_setup.h"
#include "launch/train_gaussians.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::launch {

namespace gs = models::gaussians;

gs::GaussianTrainerOptions gaussian_trainer_options(const Config& config) {
  gs::GaussianTrainerOptions o;
  o.views_per_step = config.model.views_per_step;
  o.steps = config.train.steps;
  o.seed = static_cast<uint64_t>(config.run.seed);
  o.resolution_scale = config.model.resolution_scale;
  o.densify.densify_from = config.model.densify_from;
  o.densify.densify_until = config.model.densify_until;
  o.densify.densify_every = config.model.densify_every;
  o.densify.grad_threshold = config.model.densify_grad_threshold;
  o.densify.opacity_reset_every = config.model.opacity_reset_every;
  o.densify.seed = static_cast<uint64_t>(config.run.seed);
  o.init.seed = static_cast<uint64_t>(config.run.seed);
  if (config.model.random_count > 0) o.init.random_count = config.model.random_count;
  o.sh_degree_interval = static_cast<int>(config.model.sh_degree_interval);
  // Dynamic sampling: the [sampling] schedule is the fraction of train views per epoch.
  o.sampling = sampling_options(config);
  o.num_downscales = static_cast<int>(config.model.num_downscales);
  o.resolution_schedule = config.model.resolution_schedule;
  o.views_per_pass = config.model.views_per_pass;
  if (config.checkpoint.policy == "budget") {
    if (!(config.checkpoint.budget_mib > 0))
      throw UserError("checkpoint.budget_mib must be > 0 with policy = \"budget\" (the per-rank "
                      "activation memory that sets how many views a pass renders)");
    o.memory_budget_bytes = static_cast<int64_t>(config.checkpoint.budget_mib * 1024.0 * 1024.0);
  }
  o.init_ply = config.model.init_ply;
  return o;
}

int run_gaussian_train(const Config& config, const GaussianRunOptions& run,
                       distributed::ProcessContext& context, distributed::Communicator& comm,
                       const data::SceneReader& scene) {
  const int rank = comm.rank();
  const std::filesystem::path out(config.run.out_dir);
  if (rank == 0) std::filesystem::create_directories(out / "renders");
  if (comm.device().is_cpu()) install_counting_cpu_allocator();  // peak memory per rank
  const auto start = std::chrono::steady_clock::now();
  gs::GaussianTrainer trainer(comm, scene, gaussian_trainer_options(config));
  int64_t first = 0;
  if (run.resume.empty()) {
    const int64_t initial = trainer.global_count();
    spdlog::info("gaussians: {} initial Gaussians ({} on this rank)", initial,
                 trainer.local_count());
    if (rank == 0)
      std::fprintf(stderr, "gaussians: %lld initial Gaussians on %d rank(s)\n",
                   static_cast<long long>(initial), comm.size());
  } else {
    first = trainer.load_snapshot(run.resume);
    const int64_t count = trainer.global_count();
    spdlog::info("resumed from {} at step {}: {} Gaussians ({} on this rank)", run.resume, first,
                 count, trainer.local_count());
    if (rank == 0)
      std::fprintf(stderr, "resuming from %s at step %lld: %lld Gaussians on %d rank(s)\n",
                   run.resume.c_str(), static_cast<long long>(first),
                   static_cast<long long>(count), comm.size());
  }
  // A resumed run keeps the records up to its snapshot's step (framework/trainer_run.h).
  std::ofstream metrics = open_metrics_log(config.run.out_dir, rank, first);

  std::vector<size_t> eval_views = scene.indices(config.eval.split == "train" ? data::Split::Train
                                                 : config.eval.split == "val" ? data::Split::Val
                                                                              : data::Split::Test);
  if (static_cast<int64_t>(eval_views.size()) > config.eval.max_views) eval_views.resize(config.eval.max_views);
  auto evaluate = [&](int64_t done, nlohmann::json& record) {
    const gs::GaussianTrainer::EvalScores scores =
        trainer.evaluate(eval_views, [&](size_t v, const torch::Tensor& image) {
          if (rank != 0) return;
          char name[64];
          std::snprintf(name, sizeof name, "step-%08lld-view-%03zu.png",
                        static_cast<long long>(done), v);
          data::write_png((out / "renders" / name).string(),
                          (image * 255.0f).round().clamp(0, 255).to(torch::kUInt8));
        });
    if (scores.views > 0) {
      record["eval_psnr"] = scores.psnr;
      record["eval_ssim"] = scores.ssim;
    }
  };

  // Snapshots as in Trainer::run (docs/training_loop.md): every snapshot.every steps, at the
  // step the run stops at (--until or train.steps), on SIGTERM/SIGINT, and at the end.
  StopSignals signals;
  std::string last_snapshot;
  int64_t snapshot_step = -1;
  auto save = [&] {
    last_snapshot = write_run_snapshot(comm, config.run.out_dir, trainer.steps_done(),
                                       config.snapshot.keep, [&](const std::string& path) {
      trainer.save_snapshot(context, path, run.config_toml, config.snapshot.parallel);
    });
    snapshot_step = trainer.steps_done();
  };
  const int64_t steps = config.train.steps;
  const int64_t until = run.until >= 0 ? std::min(run.until, steps) : steps;
  auto window = std::chrono::steady_clock::now();
  int64_t window_steps = 0;
  double last_eval_psnr = 0, last_eval_ssim = 0;
  LearningCheck learning(config.train.check_learning_after, "gaussians");
  for (int64_t t = first; t < until; ++t) {
    const gs::GaussianStepResult r = trainer.step(t);
    ++window_steps;
    if (const auto warning = learning.observe(t, r.loss); warning && rank == 0)
      spdlog::warn("step {}: {}", t + 1, *warning);
    const int64_t done = t + 1;
    const bool stopped = agree_stop(comm);  // one scalar allreduce per step
    const bool final_step = done == steps;
    const bool do_eval = final_step || (config.eval.every > 0 && done % config.eval.every == 0);
    const bool do_log = do_eval || stopped || done == until ||
                        (config.train.log_every > 0 && done % config.train.log_every == 0);
    if (do_log) {
      torch::Tensor peak = torch::tensor({trainer.memory().peak_bytes}, torch::kInt64);
      comm.allreduce(peak, distributed::ReduceOp::Max);
      nlohmann::json record;
      record["step"] = done;
      record["loss"] = r.loss;
      record["gaussians"] = r.global_count;
      record["sh_degree"] = r.sh_degree;
      record["sampling_rate"] = trainer.sampling_rate_at(done - 1);
      record["resolution_scale"] = r.resolution_scale;
      record["views_per_pass"] = r.views_per_pass;
      record["peak_mem_bytes"] = peak.item<int64_t>();
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double window_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - window).count();
      record["steps_per_s"] = window_s > 0 ? window_steps / window_s : 0.0;
      if (do_eval) {
        evaluate(done, record);
        last_eval_psnr = record.value("eval_psnr", 0.0);
        last_eval_ssim = record.value("eval_ssim", 0.0);
      }
      if (rank == 0) {
        metrics << record.dump() << '\n' << std::flush;
        const double eta = elapsed / (done - first) * (steps - done);
        std::fprintf(stderr, "step %lld/%lld  loss %.4f  %lld Gaussians  SH %d  rate %.2f  scale %g  "
                     "peak %s/rank%s  ETA %s\n",
                     static_cast<long long>(done), static_cast<long long>(steps), r.loss,
                     static_cast<long long>(r.global_count), r.sh_degree,
                     trainer.sampling_rate_at(done - 1), r.resolution_scale,
                     format_bytes(peak.item<int64_t>()).c_str(),
                     do_eval ? (" eval psnr " + std::to_string(last_eval_psnr)).c_str() : "",
                     log::format_duration(eta).c_str());
      }
    }
    if (snapshot_due(done, until, config.snapshot.every, stopped)) save();
    if (do_log) {
      window = std::chrono::steady_clock::now();  // eval and snapshot time not in steps/s
      window_steps = 0;
    }
    if (stopped) {
      report_stopped_by_signal(rank, done, last_snapshot,
                               " (`tessera export SNAPSHOT --ply OUT.ply` writes its Gaussians)");
      break;
    }
  }
  if (snapshot_step != trainer.steps_done() && trainer.steps_done() > first) save();
  const bool finished = trainer.steps_done() == steps;
  // The PLY of a finished run; a stopped one has its snapshot (`tessera export`).
  const std::string ply = finished ? (out / "gaussians.ply").string() : "";
  if (finished) trainer.export_ply(ply);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t final_count = trainer.global_count();
  if (rank == 0) {
    nlohmann::json summary{{"summary", true}, {"steps", trainer.steps_done()},
                           {"finished", finished}, {"last_snapshot", last_snapshot},
                           {"seconds", seconds}, {"gaussians", final_count},
                           {"eval_psnr", last_eval_psnr}, {"eval_ssim", last_eval_ssim},
                           {"ply", ply}};
    metrics << summary.dump() << '\n' << std::flush;
    std::fprintf(stderr, "%s: %lld steps in %s, %lld Gaussians, eval psnr %.2f ssim %.4f, %s\n",
                 finished ? "done" : "stopped", static_cast<long long>(trainer.steps_done()),
                 log::format_duration(seconds).c_str(), static_cast<long long>(final_count),
                 last_eval_psnr, last_eval_ssim,
                 finished ? ply.c_str() : ("snapshot " + last_snapshot).c_str());
  }
  return kExitOk;
}

}  // namespace tessera::launch
