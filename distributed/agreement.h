// Agreement helpers: checks that every rank holds the same value (an allreduce of min and max
// over the control plane), used for configs, schedules and debug-mode step checks.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::distributed {

class ProcessContext;

// A stable 64-bit fingerprint (FNV-1a) of text, identical on every platform.
uint64_t fingerprint(const std::string& text);

// Throws UserError naming `what` and the disagreeing ranks' extremes unless every rank passed
// the same `value`. Collective: every rank must call it.
void check_same_on_all_ranks(ProcessContext& context, uint64_t value, const std::string& what);
void check_same_on_all_ranks(ProcessContext& context, double value, const std::string& what);

}  // namespace tessera::distributed
