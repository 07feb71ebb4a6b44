// Shared state of multi-rank tests: the process context created by tests/mpi_test_main.cpp.
#pragma once

#include "distributed/process_context.h"

namespace tessera::test {
extern distributed::ProcessContext* g_context;
}  // namespace tessera::test
