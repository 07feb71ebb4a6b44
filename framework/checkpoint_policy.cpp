// Checkpoint policies "none", "segments" and "budget", their factory, the per-rank plan text, and
// measure_segment(), which sizes a segment's stored activations on a dry run.
#include "framework/checkpoint_policy.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <unordered_set>

#include "distributed/errors.h"
#include "framework/memory.h"

namespace tessera {
namespace {

constexpr double kBytesPerMiB = 1024.0 * 1024.0;

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

int64_t stored_if_kept(const SegmentInfo& s) { return std::max<int64_t>(s.activation_bytes, 0); }
int64_t stored_if_checkpointed(const SegmentInfo& s) {
  // Checkpointing never stores more than keeping: the outputs are part of both.
  return std::min(std::max<int64_t>(s.boundary_bytes, 0), stored_if_kept(s));
}

// A plan taken segment by segment in forward order, under the memory model of
// checkpoint_policy.h: what the segments so far store, the largest recompute transient among
// them, their recompute time and how many are checkpointed.
struct PlanState {
  int64_t stored = 0;
  int64_t transient = 0;
  double seconds = 0;
  size_t count = 0;

  // Adds the next segment; returns the memory held while it is recomputed (0 when kept).
  int64_t add(const SegmentInfo& s, bool checkpoint) {
    if (!checkpoint) {
      stored += stored_if_kept(s);
      return 0;
    }
    const int64_t held = stored + stored_if_kept(s);
    transient = std::max(transient, held);
    seconds += std::max(s.recompute_seconds, 0.0);
    ++count;
    stored += stored_if_checkpointed(s);
    return held;
  }
  // End of forward or a recompute, whichever is larger.
  int64_t peak() const { return std::max(stored, transient); }
};

// Predicted memory and recompute time of `checkpointed`.
struct PlanCost {
  PlanState totals;
  std::vector<int64_t> transient;  // per segment: the memory while it is recomputed (0 if kept)
};

PlanCost cost_of(const std::vector<SegmentInfo>& segments, const std::vector<bool>& checkpointed) {
  PlanCost c;
  for (size_t i = 0; i < segments.size(); ++i)
    c.transient.push_back(c.totals.add(segments[i], checkpointed[i]));
  return c;
}

std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, s < 1.0 ? "%.1f ms" : "%.2f s", s < 1.0 ? s * 1e3 : s);
  return text;
}

// Fills the predictions, fits and the text from `checkpointed`. `note` goes after the header.
CheckpointPlan finish_plan(const std::string& policy, const std::vector<SegmentInfo>& segments,
                           std::vector<bool> checkpointed, int64_t budget_bytes,
                           const std::string& note = "") {
  CheckpointPlan plan;
  plan.checkpointed = std::move(checkpointed);
  plan.budget_bytes = budget_bytes;
  const PlanCost cost = cost_of(segments, plan.checkpointed);
  plan.stored_bytes = cost.totals.stored;
  plan.peak_bytes = cost.totals.peak();
  plan.recompute_seconds = cost.totals.seconds;
  plan.fits = budget_bytes < 0 || plan.peak_bytes <= budget_bytes;
  size_t name_width = 4;
  for (const SegmentInfo& s : segments) name_width = std::max(name_width, s.name.size());

  std::string body;
  for (size_t i = 0; i < segments.size(); ++i) {
    const SegmentInfo& s = segments[i];
    std::string what = "kept";
    if (plan.checkpointed[i]) {
      what = "checkpointed (stores " + format_bytes(stored_if_checkpointed(s)) + "; " +
             format_bytes(cost.transient[i]) + " while recomputed";
      if (s.recompute_seconds > 0) what += ", " + format_seconds(s.recompute_seconds);
      what += ")";
    }
    char line[512];
    std::snprintf(line, sizeof line, "  [%zu] %-*s %12s  %s\n", i, static_cast<int>(name_width),
                  s.name.c_str(), format_bytes(s.activation_bytes).c_str(), what.c_str());
    body += line;
  }

  plan.text = "checkpoint plan (policy '" + policy + "'";
  if (budget_bytes >= 0) plan.text += ", budget " + format_bytes(budget_bytes);
  plan.text += "):\n";
  if (!note.empty()) plan.text += "  " + note + "\n";
  plan.text += body;
  plan.text += "  total: " + std::to_string(plan.num_checkpointed()) + " of " +
               std::to_string(segments.size()) + " segments checkpointed; stored " +
               format_bytes(plan.stored_bytes) + " at the end of forward, peak " +
               format_bytes(plan.peak_bytes);
  if (budget_bytes >= 0)
    plan.text += std::string(plan.fits ? " <= " : " > ") + "budget " + format_bytes(budget_bytes) +
                 (plan.fits ? "" : " (DOES NOT FIT)");
  if (plan.recompute_seconds > 0)
    plan.text += "; recompute " + format_seconds(plan.recompute_seconds) + " per pass";
  plan.text += "\n";
  if (!plan.checkpointed.empty() && plan.checkpointed.back())
    plan.text += "  note: checkpointing the last segment ('" + segments.back().name +
                 "') does not lower the peak: backward recomputes it first, holding what "
                 "keeping it holds\n";
  return plan;
}

class NonePolicy final : public CheckpointPolicy {
 public:
  std::string name() const override { return "none"; }
  CheckpointPlan plan(const std::vector<SegmentInfo>& segments) const override {
    return finish_plan(name(), segments, std::vector<bool>(segments.size(), false), -1);
  }
};

class SegmentsPolicy final : public CheckpointPolicy {
 public:
  explicit SegmentsPolicy(const CheckpointPolicyOptions& options)
      : names_(options.segments), every_(options.every) {
    if (every_ < 0)
      throw UserError("checkpoint policy 'segments': every = " + std::to_string(every_) +
                      " must be >= 0 (0 = off, N = the N-th, 2N-th, ... segment)");
    if (names_.empty() && every_ == 0)
      throw UserError(
          "checkpoint policy 'segments' needs a list of segment names or every = N >= 1 "
          "(use policy 'none' to checkpoint nothing)");
  }
  std::string name() const override { return "segments"; }
  CheckpointPlan plan(const std::vector<SegmentInfo>& segments) const override {
    std::vector<bool> cp(segments.size(), false);
    for (const std::string& wanted : names_) {
      auto it = std::find_if(segments.begin(), segments.end(),
                             [&](const SegmentInfo& s) { return s.name == wanted; });
      if (it == segments.end()) {
        std::vector<std::string> known;
        for (const SegmentInfo& s : segments) known.push_back(s.name);
        throw UserError("checkpoint policy 'segments': unknown segment '" + wanted +
                        "' (known: " + join(known) + ")");
      }
      cp[static_cast<size_t>(it - segments.begin())] = true;
    }
    // Never the last segment by `every`: its recompute comes first in backward and lowers the
    // peak by nothing (checkpoint_policy.h). Named, it is checkpointed, and the plan says so.
    if (every_ > 0)
      for (size_t i = 0; i + 1 < segments.size(); ++i)
        if ((i + 1) % static_cast<size_t>(every_) == 0) cp[i] = true;
    return finish_plan(name(), segments, std::move(cp), -1);
  }

 private:
  std::vector<std::string> names_;
  int64_t every_;
};

// Checkpoints the segments whose recompute costs least such that the predicted peak (the memory
// model in checkpoint_policy.h, recomputes included) fits the budget. The cost of a plan is its
// recompute time (the segments' measured forward seconds), then its number of segments (all that
// is left when no time was measured), then its peak.
//
// Exact, by dynamic programming over the segments in forward order. A partial plan (a choice
// for segments 0..i-1) is summarized by what its segments store, the largest recompute
// transient so far, its recompute time and its count; what the rest of the plan adds depends on
// the stored bytes only, and every quantity is "smaller is better", so a partial plan that is no
// better than another on all four can be dropped. For n identical segments (transformer blocks)
// at most (n + 1)^2 partial plans survive a step. With the budget, partial plans that already
// exceed it are dropped too; when none is left, the plan with the lowest peak is taken (and
// logged as not fitting). Ties keep the first found, so equal measurements give the same plan
// on every rank.
class BudgetPolicy final : public CheckpointPolicy {
 public:
  explicit BudgetPolicy(const CheckpointPolicyOptions& options) : budget_mib_(options.budget_mib) {
    if (!(budget_mib_ > 0.0))
      throw UserError("checkpoint policy 'budget': budget_mib = " + std::to_string(budget_mib_) +
                      " must be > 0 (the per-rank activation memory budget in MiB)");
  }
  std::string name() const override { return "budget"; }
  CheckpointPlan plan(const std::vector<SegmentInfo>& segments) const override {
    const auto budget = static_cast<int64_t>(budget_mib_ * kBytesPerMiB);
    std::vector<bool> best = search(segments, budget);
    if (!best.empty() || segments.empty())
      return finish_plan(name(), segments, std::move(best), budget);
    best = search(segments, -1);  // the lowest peak
    return finish_plan(name(), segments, best, budget,
                       "budget cannot be met: the lowest peak any plan reaches is " +
                           format_bytes(cost_of(segments, best).totals.peak()) + "; using that plan");
  }

 private:
  struct Partial {
    PlanState state;
    std::vector<bool> checkpointed;
  };
  static bool no_worse(const Partial& pa, const Partial& pb) {
    const PlanState &a = pa.state, &b = pb.state;
    return a.stored <= b.stored && a.transient <= b.transient && a.seconds <= b.seconds &&
           a.count <= b.count;
  }

  // The cheapest plan whose peak fits `budget` (empty when none does), or with budget < 0 the
  // plan of lowest peak, then cheapest.
  static std::vector<bool> search(const std::vector<SegmentInfo>& segments, int64_t budget) {
    std::vector<Partial> front{Partial{}};
    for (const SegmentInfo& s : segments) {
      std::vector<Partial> next;
      for (const Partial& p : front) {
        for (const bool checkpoint : {false, true}) {
          Partial q = p;
          q.state.add(s, checkpoint);
          q.checkpointed.push_back(checkpoint);
          if (budget < 0 || q.state.peak() <= budget) next.push_back(std::move(q));
        }
      }
      front.clear();
      for (size_t i = 0; i < next.size(); ++i) {
        bool dropped = false;
        for (size_t j = 0; j < next.size() && !dropped; ++j)
          if (j != i && no_worse(next[j], next[i]) && (j < i || !no_worse(next[i], next[j])))
            dropped = true;
        if (!dropped) front.push_back(std::move(next[i]));
      }
      if (front.empty()) return {};
    }
    const auto better = [&](const Partial& pa, const Partial& pb) {
      const PlanState &a = pa.state, &b = pb.state;
      if (budget < 0 && a.peak() != b.peak()) return a.peak() < b.peak();
      if (a.seconds != b.seconds) return a.seconds < b.seconds;
      if (a.count != b.count) return a.count < b.count;
      return a.peak() < b.peak();
    };
    const Partial* best = &front[0];
    for (const Partial& p : front)
      if (better(p, *best)) best = &p;
    return best->checkpointed;
  }

  double budget_mib_;
};

}  // namespace

size_t CheckpointPlan::num_checkpointed() const {
  return static_cast<size_t>(std::count(checkpointed.begin(), checkpointed.end(), true));
}

std::vector<std::string> checkpoint_policy_names() { return {"budget", "none", "segments"}; }

std::unique_ptr<CheckpointPolicy> make_checkpoint_policy(const std::string& name,
                                                         const CheckpointPolicyOptions& options) {
  if (name == "none") return std::make_unique<NonePolicy>();
  if (name == "segments") return std::make_unique<SegmentsPolicy>(options);
  if (name == "budget") return std::make_unique<BudgetPolicy>(options);
  throw UserError("unknown checkpoint policy '" + name + "' (known: " +
                  join(checkpoint_policy_names()) + ")");
}

SegmentMeasurement measure_segment(const SegmentFn& fn, const std::vector<torch::Tensor>& inputs,
                                   torch::Device device) {
  if (device.is_cpu()) install_counting_cpu_allocator();
  const MemoryStats start = memory_stats(device);
  if (!start.available)
    throw std::runtime_error("measure_segment: memory of device " + device.str() +
                             " cannot be measured in this build or on this machine");
  reset_peak(device);

  SegmentMeasurement m;
  torch::AutoGradMode grad_on(true);
  std::vector<torch::Tensor> outputs = fn(inputs);
  const MemoryStats end = memory_stats(device);  // outputs (and so their graph) still alive
  m.activation_bytes = std::max<int64_t>(end.current_bytes - start.current_bytes, 0);
  m.peak_bytes = std::max<int64_t>(end.peak_bytes - start.current_bytes, 0);

  std::unordered_set<const void*> seen;
  for (const torch::Tensor& t : inputs)
    if (t.defined() && t.has_storage()) seen.insert(t.storage().data());
  for (const torch::Tensor& t : outputs) {
    if (!t.defined() || !t.has_storage() || t.device().type() != device.type()) continue;
    if (seen.insert(t.storage().data()).second)
      m.output_bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  m.output_bytes = std::min(m.output_bytes, m.activation_bytes);

  // The time of a second forward, as a recompute runs it: the first one paid for first touches
  // (fresh pages, one-time setup) that a training step does not.
  outputs.clear();
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  const auto start_time = std::chrono::steady_clock::now();
  outputs = fn(inputs);
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  m.forward_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  return m;
}

}  // namespace tessera
