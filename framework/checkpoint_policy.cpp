// Checkpoint policies "none", "segments" and "budget", their factory, the per-rank plan text, and
// measure_segment(), which sizes a segment's stored activations on a dry run.
#include "framework/checkpoint_policy.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
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

// Fills stored_bytes, fits and the text from `checkpointed`. `note` goes after the header.
CheckpointPlan finish_plan(const std::string& policy, const std::vector<SegmentInfo>& segments,
                           std::vector<bool> checkpointed, int64_t budget_bytes,
                           const std::string& note = "") {
  CheckpointPlan plan;
  plan.checkpointed = std::move(checkpointed);
  plan.budget_bytes = budget_bytes;
  size_t name_width = 4;
  for (const SegmentInfo& s : segments) name_width = std::max(name_width, s.name.size());

  std::string body;
  for (size_t i = 0; i < segments.size(); ++i) {
    const SegmentInfo& s = segments[i];
    const bool cp = plan.checkpointed[i];
    plan.stored_bytes += cp ? stored_if_checkpointed(s) : stored_if_kept(s);
    char line[512];
    std::snprintf(line, sizeof line, "  [%zu] %-*s %12s  %s\n", i, static_cast<int>(name_width),
                  s.name.c_str(), format_bytes(s.activation_bytes).c_str(),
                  cp ? ("checkpointed (stores " + format_bytes(stored_if_checkpointed(s)) + ")")
                           .c_str()
                     : "kept");
    body += line;
  }
  plan.fits = budget_bytes < 0 || plan.stored_bytes <= budget_bytes;

  plan.text = "checkpoint plan (policy '" + policy + "'";
  if (budget_bytes >= 0) plan.text += ", budget " + format_bytes(budget_bytes);
  plan.text += "):\n";
  if (!note.empty()) plan.text += "  " + note + "\n";
  plan.text += body;
  plan.text += "  total: " + std::to_string(plan.num_checkpointed()) + " of " +
               std::to_string(segments.size()) + " segments checkpointed; stored " +
               format_bytes(plan.stored_bytes);
  if (budget_bytes >= 0)
    plan.text += std::string(plan.fits ? " <= " : " > ") + "budget " + format_bytes(budget_bytes) +
                 (plan.fits ? "" : " (DOES NOT FIT)");
  plan.text += "\n";
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
    if (every_ > 0)
      for (size_t i = 0; i < segments.size(); ++i)
        if ((i + 1) % static_cast<size_t>(every_) == 0) cp[i] = true;
    return finish_plan(name(), segments, std::move(cp), -1);
  }

 private:
  std::vector<std::string> names_;
  int64_t every_;
};

// Checkpoints the FEWEST segments such that what stays stored fits the budget.
//
// Keeping every segment stores K = sum(activation_i); checkpointing segment i lowers that by its
// saving s_i = activation_i - boundary_i >= 0, independently of the other choices. A set S fits
// iff sum_{i in S} s_i >= K - budget. Greedy takes segments by decreasing s_i and stops as soon
// as the running sum reaches K - budget, after k segments. It is optimal for "fewest": if some
// set S with |S| = j < k fitted, then the j largest savings, whose sum is >= sum over S (each
// of them is >= the matching element of S sorted in decreasing order), would already reach
// K - budget, and greedy would have stopped after j. Ties are broken by segment order, so the
// plan is deterministic (and identical on every rank given identical measurements).
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
    int64_t stored = 0;
    for (const SegmentInfo& s : segments) stored += stored_if_kept(s);

    std::vector<size_t> order(segments.size());
    std::iota(order.begin(), order.end(), 0);
    auto saving = [&](size_t i) {
      return stored_if_kept(segments[i]) - stored_if_checkpointed(segments[i]);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return saving(a) > saving(b); });

    std::vector<bool> cp(segments.size(), false);
    for (size_t k = 0; k < order.size() && stored > budget; ++k) {
      if (saving(order[k]) <= 0) break;  // the rest cannot help
      cp[order[k]] = true;
      stored -= saving(order[k]);
    }
    if (stored <= budget) return finish_plan(name(), segments, std::move(cp), budget);

    // Even checkpointing every segment leaves the outputs stored above the budget: do the most
    // we can, checkpoint everything, and say so in the plan (the trainer logs it; no throw).
    int64_t floor = 0;
    for (const SegmentInfo& s : segments) floor += stored_if_checkpointed(s);
    return finish_plan(name(), segments, std::vector<bool>(segments.size(), true), budget,
                       "budget cannot be met: even with every segment checkpointed " +
                           format_bytes(floor) + " stay stored; checkpointing all segments");
  }

 private:
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
  return m;
}

}  // namespace tessera
