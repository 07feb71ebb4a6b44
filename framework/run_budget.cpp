// TrainingRun's budgets (framework/budget.h, docs/training_loop.md "Budgets"): the plan from
// train.epochs, the time budget's plans from measured step times, and its last guard.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "framework/budget.h"
#include "framework/learning_check.h"
#include "framework/log.h"
#include "framework/run.h"

namespace tessera {

namespace {

// Steps between two plans of a time budget, after the first at kFirstPlan steps.
constexpr int64_t kFirstPlan = 10;
constexpr int64_t kReplanEvery = 50;
// The step time a plan uses: each window's time and cost added to the earlier ones' times this
// weight, so a plan follows a trend (a model grows by densification, or its occupancy grid
// empties) over ~3 windows instead of the noise of one (a ray-marched step's samples vary with
// its rays: +-30% window to window).
constexpr double kEarlierWindowsWeight = 0.7;
// The final eval's forecast from a probe (ModelFamily::eval_probe) is its time scaled to the
// eval's work, times this: the eval also gathers the images, scores and writes them, and the
// model's speed moves between the plan and the end (measured: docs/performance.md, "The final
// eval's forecast from a probe").
constexpr double kEvalProbeMargin = 1.25;

}  // namespace

std::pair<std::vector<size_t>, std::vector<size_t>> TrainingRun::eval_view_lists() const {
  const data::Split split = data::parse_split(options_.eval_split, "eval.split");
  // Spread over the split, as the train views below: the first views of a capture (every 8th
  // photo of a walk-through, say) would score one place of it.
  std::vector<size_t> views = dataset_.indices(split);
  if (options_.eval_max_views >= 0) views = spread_views(views, options_.eval_max_views);
  // How well the model fits what it trains on, beside how well it renders new views (scored
  // for families that report PSNR). As many as the eval views at most, so that the gap costs
  // at most the eval's own time again.
  std::vector<size_t> train;
  if (split != data::Split::Train && options_.eval_train_views > 0)
    train = spread_views(dataset_.indices(data::Split::Train),
                         std::min(options_.eval_train_views, static_cast<int64_t>(views.size())));
  return {views, train};
}

double TrainingRun::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void TrainingRun::set_steps(int64_t steps) {
  options_.steps = steps;
  if (steps == schedule_steps_) return;
  schedule_steps_ = steps;
  family_.set_total_steps(steps);
}

std::string TrainingRun::plan_text() const {
  std::string text = "plan: " + std::to_string(options_.steps) + " steps (" + plan_source_ + ")";
  if (options_.time_budget_s > 0)
    text += ", within a time budget of " + log::format_duration(options_.time_budget_s) +
            " (planned again from the step times after step " + std::to_string(next_replan_) +
            ")";
  return text;
}

double TrainingRun::budget_reserve(double eval_s, double snapshot_s) const {
  // Before any eval was measured, its forecast (unless the first plan deferred it: replan).
  if (eval_s < 0) eval_s = forecast_deferred_ ? 0.0 : eval_forecast_s_;
  return std::max(0.0, eval_s) + std::max(0.0, snapshot_s);
}

double TrainingRun::forecast_eval_cost() const {
  const auto [views, train] = eval_view_lists();
  return family_.eval_cost(views) + family_.eval_cost(train);
}

double TrainingRun::probe_eval_seconds(int64_t step) {
  if (!options_.eval_probe) return -1.0;
  auto [views, train] = eval_view_lists();
  views.insert(views.end(), train.begin(), train.end());
  if (views.empty()) return -1.0;
  const double start = now();
  const double fraction = family_.eval_probe(views, step);
  if (!(fraction > 0)) return -1.0;
  return (now() - start) / fraction * kEvalProbeMargin;
}

void TrainingRun::start_budget(int64_t first) {
  budget_start_ = now() - elapsed_before_;
  next_replan_ = first + kFirstPlan;
  window_s_ = 0.0;
  window_cost_ = 0.0;
  smoothed_s_ = 0.0;
  smoothed_cost_ = 0.0;
  plans_ = 0;
  eval_cost_ = 0.0;
  eval_forecast_s_ = 0.0;
  forecast_deferred_ = false;
  eval_warned_ = false;
  const std::string text = plan_text();
  spdlog::info("{}", text);
  if (comm_.rank() == 0 && options_.progress) std::fprintf(stderr, "%s\n", text.c_str());
}

void TrainingRun::budget_step(int64_t step, double step_s) {
  if (!(options_.time_budget_s > 0)) return;
  last_step_s_ = step_s;
  if (step > first_step_) {  // the run's first step warms up (allocations, caches): not timed
    window_s_ += step_s;
    window_cost_ += family_.step_cost(step);
  }
  replan(step + 1);
  out_of_time(step + 1);
}

void TrainingRun::replan(int64_t done) {
  if (done < next_replan_ || window_cost_ <= 0) return;
  // The slowest rank's times (steps, elapsed, eval, snapshot) and the largest eval forecast
  // (the family's, at its current costs, and its probe's where it has one, timed before the
  // elapsed time is read): the same plan on every rank. Once an eval was measured, no probe.
  const double probe_s = last_eval_s_ < 0 ? probe_eval_seconds(done) : -1.0;
  torch::Tensor measured = torch::tensor(
      {window_s_, budget_elapsed(), last_eval_s_, last_snapshot_s_, forecast_eval_cost(), probe_s},
      torch::TensorOptions().dtype(torch::kFloat64));
  if (comm_.device().is_cuda()) measured = measured.to(comm_.device());
  comm_.allreduce(measured, distributed::ReduceOp::Max);
  measured = measured.cpu();
  smoothed_s_ = kEarlierWindowsWeight * smoothed_s_ + measured[0].item<double>();
  smoothed_cost_ = kEarlierWindowsWeight * smoothed_cost_ + window_cost_;
  seconds_per_cost_ = smoothed_s_ / smoothed_cost_;
  const double elapsed = measured[1].item<double>();
  eval_cost_ = measured[4].item<double>();
  const bool probed = measured[5].item<double>() >= 0;  // else the family has no probe
  eval_forecast_s_ = probed ? measured[5].item<double>() : eval_cost_ * seconds_per_cost_;
  window_s_ = 0.0;
  window_cost_ = 0.0;
  next_replan_ = done + kReplanEvery;
  ++plans_;
  const bool was_deferred = forecast_deferred_;
  forecast_deferred_ = false;

  BudgetState state;
  state.budget_s = options_.time_budget_s;
  state.elapsed_s = elapsed;
  state.done = done;
  state.seconds_per_cost = seconds_per_cost_;
  double cost = 0.0;
  for (int64_t s = done; s < options_.steps; ++s) cost += family_.step_cost(s);
  state.mean_cost = options_.steps > done ? cost / static_cast<double>(options_.steps - done) : 1.0;
  state.cap = step_cap_;
  const double eval_s = measured[2].item<double>();
  const double snapshot_s = measured[3].item<double>();
  const double forecast_s = eval_s >= 0 ? eval_s : eval_forecast_s_;
  state.reserve_s = budget_reserve(eval_s, snapshot_s);  // forecast_deferred_ is reset above
  int64_t steps = steps_within_budget(state);
  if (plans_ == 1) {
    // The first plan's steps are the model's first: a ray-marched model has learned no opacity
    // yet, so every marched sample is rendered and a step takes about twice as long as later ones
    // (field_drone: 296 rendered samples a ray up to step 15, ~120 from step 20), and an eval
    // forecast at their speed is as much too long. So that forecast does not end the run: it
    // trains on (as far as the steps alone fit) to a second plan, which prices the steps and the
    // eval from the steps after this one only. (The last guard, out_of_time, does not keep the
    // forecast either until then.) Whatever the eval, these steps' times are not kept.
    if (eval_s < 0) {
      BudgetState unreserved = state;
      unreserved.reserve_s = budget_reserve(0.0, snapshot_s);
      const int64_t deferred = std::min(steps_within_budget(unreserved), next_replan_);
      if (deferred > steps) {
        steps = deferred;
        forecast_deferred_ = true;
        next_replan_ = std::min(next_replan_, std::max(done + 1, steps - 1));
      }
    }
    smoothed_s_ = 0.0;
    smoothed_cost_ = 0.0;
  }
  // The plan after a deferred one finds that the eval does not fit what is left: the run ends
  // here and overruns by its eval (a config problem: say so once). At a run's normal end the
  // plans and the guard keep the eval within the budget instead.
  const double left = (1.0 - kBudgetMargin) * state.budget_s - elapsed;
  if (was_deferred && eval_s < 0 && forecast_s > left && !eval_warned_) {
    eval_warned_ = true;
    if (comm_.rank() == 0)
      spdlog::warn("the final eval is forecast to take {}, more than the {} left of the time budget "
                   "of {}: the run ends now and overruns the budget by its eval; lower "
                   "eval.max_views or eval.train_views, or raise train.time_budget_minutes",
                   log::format_duration(forecast_s), log::format_duration(std::max(0.0, left)),
                   log::format_duration(options_.time_budget_s));
  }
  // A change of under 2% is noise in the step times: not worth moving the schedules.
  if (std::llabs(steps - options_.steps) * 50 <= options_.steps) return;
  const int64_t before = options_.steps;
  set_steps(steps);
  char kept[160];
  if (forecast_deferred_)
    std::snprintf(kept, sizeof(kept),
                  "the final eval's forecast from these first steps (%s) kept from step %lld on",
                  log::format_duration(forecast_s).c_str(), static_cast<long long>(next_replan_));
  else
    std::snprintf(kept, sizeof(kept), "%s kept for the final eval%s and snapshot",
                  log::format_duration(state.reserve_s).c_str(),
                  eval_s < 0 && probed ? " (forecast from a timed sample of it)" : "");
  char text[400];
  std::snprintf(text, sizeof(text),
                "plan: %lld steps (was %lld) to end within the time budget of %s: %.3g s per "
                "step measured up to step %lld, %s elapsed, %s",
                static_cast<long long>(steps), static_cast<long long>(before),
                log::format_duration(options_.time_budget_s).c_str(),
                seconds_per_cost_ * state.mean_cost, static_cast<long long>(done),
                log::format_duration(elapsed).c_str(), kept);
  spdlog::info("{}", text);
  if (comm_.rank() == 0 && options_.progress) std::fprintf(stderr, "%s\n", text);
}

bool TrainingRun::out_of_time(int64_t done) {
  if (done >= options_.steps) return false;
  // The plan's forecast, or the last step's time when the steps became slower than planned.
  const double next_step_s = std::max(seconds_per_cost_ * family_.step_cost(done), last_step_s_);
  torch::Tensor over = torch::tensor(
      {static_cast<int64_t>(budget_exhausted(options_.time_budget_s, budget_elapsed(),
                                             next_step_s,
                                             budget_reserve(last_eval_s_, last_snapshot_s_)))},
      torch::TensorOptions().dtype(torch::kInt64).device(comm_.device()));
  comm_.allreduce(over, distributed::ReduceOp::Max);
  if (over.item<int64_t>() == 0) return false;
  char text[256];
  std::snprintf(text, sizeof(text),
                "time budget of %s reached: the run ends at step %lld of the %lld planned, with "
                "its final eval and snapshot",
                log::format_duration(options_.time_budget_s).c_str(),
                static_cast<long long>(done), static_cast<long long>(options_.steps));
  if (comm_.rank() == 0) spdlog::warn("{}", text);
  options_.steps = done;  // the schedules stay as planned (schedule_steps_): they end here
  return true;
}

}  // namespace tessera
