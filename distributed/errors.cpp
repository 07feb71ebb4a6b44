// Out-of-line bodies of the error-check macros in errors.h: each builds one message with the
// failing expression, file:line, the rank and the library's own description of the code.
#include "distributed/errors.h"

#include <mpi.h>

#include <atomic>
#include <sstream>

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tessera {

namespace {
std::atomic<int> g_error_rank{-1};

std::string where(const char* expr, const char* file, int line) {
  std::ostringstream out;
  out << "rank " << g_error_rank.load() << ": " << expr << " failed at " << file << ":" << line;
  return out.str();
}
}  // namespace

int error_rank() { return g_error_rank.load(); }
void set_error_rank(int rank) { g_error_rank.store(rank); }

namespace detail {

void throw_mpi_error(int code, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) text[0] = '\0';
  throw DistributedError(where(expr, file, line) + ": MPI error " + std::to_string(code) + " (" +
                         text + ")");
}

void throw_cuda_error(int code, const char* expr, const char* file, int line) {
#ifdef TESSERA_WITH_CUDA
  const char* text = cudaGetErrorString(static_cast<cudaError_t>(code));
#else
  const char* text = "CUDA is not part of this build";
#endif
  throw std::runtime_error(where(expr, file, line) + ": CUDA error " + std::to_string(code) +
                           " (" + text + ")");
}

void throw_h5_error(long long code, const char* expr, const char* file, int line) {
  throw std::runtime_error(where(expr, file, line) + ": HDF5 returned " + std::to_string(code) +
                           " (HDF5's error stack above has the details)");
}

#ifndef TESSERA_WITH_NCCL
void throw_nccl_error(int code, const char* expr, const char* file, int line) {
  throw DistributedError(where(expr, file, line) + ": NCCL error " + std::to_string(code) +
                         " (NCCL is not part of this build)");
}
#endif

}  // namespace detail
}  // namespace tessera
