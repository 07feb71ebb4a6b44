// Agreement helpers: checks that every rank holds the same value (an allreduce of min and max
// over the control plane), used for configs, schedules and debug-mode step checks; text sent to
// every rank or gathered on one; and the first failure among the ranks, agreed by all (snapshots, the run lock).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::distributed {

class ProcessContext;

// A stable 64-bit fingerprint (FNV-1a) of text, identical on every platform.
uint64_t fingerprint(const std::string& text);

// Throws UserError naming `what` and the disagreeing ranks' extremes unless every rank passed
// the same `value`. Collective: every rank must call it.
void check_same_on_all_ranks(ProcessContext& context, uint64_t value, const std::string& what);
void check_same_on_all_ranks(ProcessContext& context, double value, const std::string& what);

// Rank `root`'s `text` on every rank (replaced in place). Collective.
void broadcast_string(ProcessContext& context, std::string& text, int root);

// Every rank's `text` on rank `root`, in rank order (an empty vector on the other ranks).
// Collective, over the control plane.
std::vector<std::string> gather_strings(ProcessContext& context, const std::string& text, int root);

// The first failing rank and its message, the same on every rank; rank -1 when none failed.
struct Failure {
  int rank = -1;
  std::string message;
  bool failed() const { return rank >= 0; }
};

// Every rank passes its own error ("" when it succeeded) and learns the lowest failing rank's.
// Collective, watched by the watchdog as `what`.
Failure agree_on_failure(ProcessContext& context, const std::string& local, const std::string& what);

}  // namespace tessera::distributed
