// LR and sampling-rate schedules: option validation (UserError naming the key) and the
// closed-form values, all in double so that every rank computes bit-identical numbers.
#include "framework/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "distributed/errors.h"

namespace tessera {
namespace {

constexpr double kPi = 3.14159265358979323846;

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void check_name(const char* what, const std::string& name, const std::vector<std::string>& known) {
  if (std::find(known.begin(), known.end(), name) == known.end())
    throw UserError(std::string("unknown ") + what + " '" + name + "'; known: " + join(known));
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// A rate in (0, 1]; written so that NaN fails too.
void check_rate(const char* key, double v) {
  if (!(v > 0.0 && v <= 1.0))
    throw UserError(std::string("sampling schedule: ") + key + " = " + num(v) +
                    " is out of range; a sampling rate must lie in (0, 1]");
}

void check_step(int64_t step) {
  if (step < 0)
    throw std::invalid_argument("schedule: step must be >= 0, got " + std::to_string(step));
}

// Fraction of the schedule done, t / T clamped to [0, 1].
double progress(int64_t step, int64_t total) {
  return static_cast<double>(std::min(step, total)) / static_cast<double>(total);
}

}  // namespace

std::vector<std::string> lr_schedule_names() { return {"constant", "exponential", "cosine"}; }
std::vector<std::string> sampling_schedule_names() {
  return {"constant", "linear", "cosine", "step"};
}

LrSchedule::LrSchedule(LrScheduleOptions o) : options_(std::move(o)) {
  check_name("learning-rate schedule", options_.name, lr_schedule_names());
  if (!(options_.lr > 0.0) || !std::isfinite(options_.lr))
    throw UserError("learning-rate schedule: lr = " + num(options_.lr) +
                    " must be a finite number > 0");
  if (options_.name == "exponential" &&
      !(options_.final_lr > 0.0 && options_.final_lr <= options_.lr))
    throw UserError("learning-rate schedule 'exponential': final_lr = " + num(options_.final_lr) +
                    " must lie in (0, lr = " + num(options_.lr) + "]");
  if (options_.name == "cosine" && !(options_.final_lr >= 0.0 && options_.final_lr <= options_.lr))
    throw UserError("learning-rate schedule 'cosine': final_lr = " + num(options_.final_lr) +
                    " must lie in [0, lr = " + num(options_.lr) + "]");
  if (options_.total_steps < 1)
    throw UserError("learning-rate schedule: total_steps = " +
                    std::to_string(options_.total_steps) + " must be >= 1");
  if (options_.warmup_steps < 0 || options_.warmup_steps > options_.total_steps)
    throw UserError("learning-rate schedule: warmup_steps = " +
                    std::to_string(options_.warmup_steps) + " must lie in [0, total_steps = " +
                    std::to_string(options_.total_steps) + "]");
}

double LrSchedule::at(int64_t step) const {
  check_step(step);
  const LrScheduleOptions& o = options_;
  const double p = progress(step, o.total_steps);
  double lr = o.lr;
  if (o.name == "exponential") {
    lr = o.lr * std::pow(o.final_lr / o.lr, p);
  } else if (o.name == "cosine") {
    lr = o.final_lr + (o.lr - o.final_lr) * 0.5 * (1.0 + std::cos(kPi * p));
  }
  if (step < o.warmup_steps)
    lr *= static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  return lr;
}

SamplingSchedule::SamplingSchedule(SamplingScheduleOptions o) : options_(std::move(o)) {
  check_name("sampling schedule", options_.name, sampling_schedule_names());
  check_rate("rate_max", options_.rate_max);
  if (options_.total_steps < 1)
    throw UserError("sampling schedule: total_steps = " + std::to_string(options_.total_steps) +
                    " must be >= 1");
  if (options_.name == "constant") return;  // rate_min and the step keys are unused
  check_rate("rate_min", options_.rate_min);
  if (options_.rate_min > options_.rate_max)
    throw UserError("sampling schedule '" + options_.name + "': rate_min = " +
                    num(options_.rate_min) + " is greater than rate_max = " +
                    num(options_.rate_max));
  if (options_.name == "step") {
    if (options_.step_every < 1)
      throw UserError("sampling schedule 'step': step_every = " +
                      std::to_string(options_.step_every) + " must be >= 1");
    if (!(options_.step_factor > 0.0 && options_.step_factor <= 1.0))
      throw UserError("sampling schedule 'step': step_factor = " + num(options_.step_factor) +
                      " must lie in (0, 1]");
  }
}

double SamplingSchedule::at(int64_t step) const {
  check_step(step);
  const SamplingScheduleOptions& o = options_;
  const double p = progress(step, o.total_steps);
  const double span = o.rate_max - o.rate_min;
  double rate = o.rate_max;
  if (o.name == "linear") {
    rate = o.rate_max - span * p;
  } else if (o.name == "cosine") {
    rate = o.rate_min + span * 0.5 * (1.0 + std::cos(kPi * p));
  } else if (o.name == "step") {
    const int64_t drops = std::min(step, o.total_steps) / o.step_every;
    rate = o.rate_max * std::pow(o.step_factor, static_cast<double>(drops));
  }
  if (o.name != "constant") rate = std::min(o.rate_max, std::max(o.rate_min, rate));
  return rate;
}

double lr_rescale(double rate, double rate_max) {
  if (!(rate > 0.0) || !(rate_max > 0.0))
    throw std::invalid_argument("lr_rescale: rates must be > 0, got rate = " + num(rate) +
                                ", rate_max = " + num(rate_max));
  return std::sqrt(rate / rate_max);
}

}  // namespace tessera
