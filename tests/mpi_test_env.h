// Shared state of multi-rank tests: the process context created by tests/mpi_test_main.cpp, a CPU
// communicator over every rank, and a temp folder made by rank 0 and known to every rank (one
// node: CTest runs all ranks locally).
#pragma once

#include <mpi.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/process_context.h"

namespace tessera::test {

extern distributed::ProcessContext* g_context;

// What tests/mpi_test_main.cpp runs after the last test, latest first, while MPI, the process
// context and its watchdog still exist: the release of communicators that a test keeps in a
// static (a static's destructor would run after MPI_Finalize, with the context gone).
inline std::vector<std::function<void()>>& before_finalize() {
  static std::vector<std::function<void()>> releases;
  return releases;
}

// One MPI communicator over every rank, on the CPU, for the whole test run.
inline distributed::Communicator& cpu_world() {
  static std::unique_ptr<distributed::Communicator> c = [] {
    before_finalize().push_back([] { c.reset(); });
    return distributed::make_communicator(*g_context, "mpi", torch::Device(torch::kCPU));
  }();
  return *c;
}

// Rank 0 creates a fresh folder under the system temp dir named PREFIX-XXXXXX and runs `fill` in
// it; then every rank gets the path. Collective.
inline std::string make_shared_temp_dir(const std::string& prefix,
                                        const std::function<void(const std::string&)>& fill = {}) {
  char path[512] = {0};
  if (g_context->rank() == 0) {
    const std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    std::snprintf(path, sizeof(path), "%s", pattern.c_str());
    if (mkdtemp(path) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    if (fill) fill(path);
  }
  MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, g_context->world());
  return path;
}

// Waits for every rank, then rank 0 removes the folder. Collective.
inline void remove_shared_temp_dir(const std::string& path) {
  MPI_Barrier(g_context->world());
  if (g_context->rank() == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
}

}  // namespace tessera::test
