// Learning-rate and sampling-rate schedules: pure functions of the step, built by name from the
// config ([train] and [sampling]), so every rank computes the same value at every step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// name: constant | exponential | cosine (see docs/training.md for the formulas).
//   constant:    lr
//   exponential: lr * (final_lr / lr)^(t / T)
//   cosine:      final_lr + (lr - final_lr) * (1 + cos(pi t / T)) / 2
// Warm-up multiplies by (t + 1) / warmup_steps for t < warmup_steps (a linear ramp from
// lr / warmup_steps). Steps past total_steps hold the value at total_steps.
struct LrScheduleOptions {
  std::string name = "constant";
  double lr = 1e-2;
  double final_lr = 1e-4;   // used by exponential and cosine only
  int64_t total_steps = 1;  // T
  int64_t warmup_steps = 0;
};

// The schedule of a config section with the keys lr_schedule, lr, final_lr and warmup_steps
// (a model family's own section) over `steps` steps.
template <typename Section>
LrScheduleOptions lr_schedule_options(const Section& section, int64_t steps) {
  LrScheduleOptions lr;
  lr.name = section.lr_schedule;
  lr.lr = section.lr;
  lr.final_lr = section.final_lr;
  lr.total_steps = steps;
  lr.warmup_steps = section.warmup_steps;
  return lr;
}

class LrSchedule {
 public:
  // Validates the options; throws tessera::UserError naming the problem.
  explicit LrSchedule(LrScheduleOptions options);
  double at(int64_t step) const;  // step >= 0
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

// name: constant | linear | cosine | step.
//   constant: rate_max
//   linear:   max - (max - min) * t / T
//   cosine:   min + (max - min) * (1 + cos(pi t / T)) / 2
//   step:     max * factor^floor(t / step_every), never below min
// Rates lie in (0, 1]. Steps past total_steps hold the value at total_steps.
struct SamplingScheduleOptions {
  std::string name = "constant";
  double rate_max = 1.0;
  double rate_min = 1.0;     // used by linear, cosine and step only
  int64_t total_steps = 1;   // T
  int64_t step_every = 1000; // step only
  double step_factor = 0.5;  // step only, in (0, 1]
};

class SamplingSchedule {
 public:
  // Validates the options; throws tessera::UserError naming the problem.
  explicit SamplingSchedule(SamplingScheduleOptions options);
  double at(int64_t step) const;  // step >= 0
  const SamplingScheduleOptions& options() const { return options_; }

 private:
  SamplingScheduleOptions options_;
};

// LR rescale when the sampling rate drops: lr * sqrt(rate / rate_max) (fewer rays per step, so
// smaller steps, by the square-root rule for batch size). The trainer combines it with the LR
// schedule: lr_t = LrSchedule.at(t) * lr_rescale(rate_t, rate_max). Requires 0 < rate, rate_max.
double lr_rescale(double rate, double rate_max);

std::vector<std::string> lr_schedule_names();        // for the config schema's choices
std::vector<std::string> sampling_schedule_names();

}  // namespace tessera
