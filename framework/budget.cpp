// Step plans from epochs and time budgets (budget.h).
#include "framework/budget.h"

#include <algorithm>
#include <cmath>

#include "distributed/errors.h"
#include "framework/config_schema.h"

namespace tessera {

int64_t steps_for_epochs(double epochs, const EpochSize& size, const std::string& model) {
  if (!(size.work_per_step > 0))
    throw UserError("train.epochs: model '" + model + "' does not count its training in epochs; "
                    "set train.steps and train.epochs = 0");
  if (!(size.work > 0))
    throw UserError("train.epochs: the dataset has no training data to make an epoch of");
  const double steps = std::ceil(epochs * size.work / size.work_per_step - 1e-9);
  return static_cast<int64_t>(std::clamp(steps, 1.0, config_schema::kMaxSteps));
}

int64_t steps_within_budget(const BudgetState& s) {
  const int64_t least = s.done + 1;
  const int64_t most = std::max(least, s.cap);
  const double step_s = s.seconds_per_cost * s.mean_cost;
  if (!(step_s > 0) || !std::isfinite(step_s)) return most;
  const double left = (1.0 - kBudgetMargin) * s.budget_s - s.elapsed_s - s.reserve_s;
  if (!(left > 0)) return least;
  const double more = std::floor(left / step_s);
  if (more >= static_cast<double>(most - s.done)) return most;
  return std::max(least, s.done + static_cast<int64_t>(more));
}

bool budget_exhausted(double budget_s, double elapsed_s, double next_step_s, double reserve_s) {
  return elapsed_s + std::max(0.0, next_step_s) + std::max(0.0, reserve_s) > budget_s;
}

}  // namespace tessera
