// How many steps a run trains (docs/training_loop.md, "Budgets"): train.steps, or train.epochs
// passes over the training data, planned to fit train.time_budget_minutes from the step times
// the run measures. Pure arithmetic here; TrainingRun (framework/run.h) applies it.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

// One pass over the training data in the family's work units (ModelFamily::work_unit): what the
// pass holds (e.g. the train views' pixels, the train views or the train shapes) and what one
// step consumes (e.g. the rays, views or shapes of a step).
struct EpochSize {
  double work = 0.0;
  double work_per_step = 0.0;  // 0: the family has no epochs
};

// ceil(epochs * work / work_per_step), at least 1 and at most kMaxSteps. UserError when the
// family has no epochs (work_per_step 0) or the dataset has no training data.
int64_t steps_for_epochs(double epochs, const EpochSize& size, const std::string& model);

// The budget keeps this fraction of itself unplanned: step times vary (an occupancy grid
// empties, a model densifies), and the last check before the deadline is a step away.
constexpr double kBudgetMargin = 0.05;

// What a time budget allows after `done` steps, from what the run measured.
struct BudgetState {
  double budget_s = 0.0;          // train.time_budget_minutes in seconds
  double elapsed_s = 0.0;         // since the run started (a resumed run: plus before)
  int64_t done = 0;               // steps done
  double seconds_per_cost = 0.0;  // of a step, per unit of ModelFamily::step_cost (measured)
  double mean_cost = 1.0;         // ModelFamily::step_cost averaged over the planned rest
  double reserve_s = 0.0;         // kept for the final eval and snapshot
  int64_t cap = 1;                // the most steps: train.steps or train.epochs' count
};

// The step count whose remaining steps end by (1 - kBudgetMargin) * budget - reserve: within
// [done + 1, cap] (a run always takes the step it is at, and never more than its cap).
int64_t steps_within_budget(const BudgetState& state);

// Whether the step after `done` would end past the budget with the reserve kept: the last
// guard, for a plan that the step times outran. `next_step_s`: the expected seconds of a step.
bool budget_exhausted(double budget_s, double elapsed_s, double next_step_s, double reserve_s);

}  // namespace tessera
