// Typed errors and every error-check macro of Tessera (CUDA_CHECK, NCCL_CHECK, MPI_CHECK, H5_CHECK).
// UserError -> exit 2 (bad config, dataset or CLI input); DistributedError -> exit 3.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

// Exit codes of the `tessera` executable (README.md, "Exit codes").
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;      // anything unexpected
constexpr int kExitBadInput = 2;     // config, dataset or CLI input that the user must fix
constexpr int kExitDistributed = 3;  // a failed collective, a dead peer or a timeout

// Input the user can fix. The message says what is wrong and how to fix it; the CLI prints it
// without a stack trace and exits with kExitBadInput.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure of the distributed runtime (collective error, peer lost, timeout). The whole job is
// aborted with kExitDistributed.
class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The world rank of this process, shown in every error message; -1 until MPI is initialized.
int error_rank();
void set_error_rank(int rank);

namespace detail {
// Out of line so that this header pulls in neither mpi.h, cuda_runtime.h, nccl.h nor hdf5.h.
[[noreturn]] void throw_mpi_error(int code, const char* expr, const char* file, int line);
[[noreturn]] void throw_cuda_error(int code, const char* expr, const char* file, int line);
// Throws only: a communicator is ended by its owner (NcclCommunicator::check aborts it once first).
[[noreturn]] void throw_nccl_error(int code, const char* expr, const char* file, int line);
[[noreturn]] void throw_h5_error(long long code, const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace tessera

// Each macro evaluates `expr` once and throws with the expression, file:line and the rank.
#define MPI_CHECK(expr)                                                            \
  do {                                                                             \
    const int tessera_rc_ = (expr);                                                \
    if (tessera_rc_ != 0 /* MPI_SUCCESS */)                                        \
      ::tessera::detail::throw_mpi_error(tessera_rc_, #expr, __FILE__, __LINE__);  \
  } while (0)

#define CUDA_CHECK(expr)                                                                     \
  do {                                                                                       \
    const int tessera_rc_ = static_cast<int>(expr);                                          \
    if (tessera_rc_ != 0 /* cudaSuccess */)                                                  \
      ::tessera::detail::throw_cuda_error(tessera_rc_, #expr, __FILE__, __LINE__);           \
  } while (0)

// For NCCL calls outside a live communicator (ncclGetUniqueId, ncclCommInitRank, ncclGetVersion).
// A call on a communicator goes through NcclCommunicator::check, which aborts it (once) first.
#define NCCL_CHECK(expr)                                                                           \
  do {                                                                                             \
    const int tessera_rc_ = static_cast<int>(expr);                                                \
    if (tessera_rc_ != 0 /* ncclSuccess */ && tessera_rc_ != 7 /* ncclInProgress */)               \
      ::tessera::detail::throw_nccl_error(tessera_rc_, #expr, __FILE__, __LINE__);                 \
  } while (0)

// HDF5 calls return a negative value (herr_t or hid_t) on failure.
#define H5_CHECK(expr)                                                                       \
  ([&]() {                                                                                   \
    const auto tessera_rc_ = (expr);                                                         \
    if (tessera_rc_ < 0)                                                                     \
      ::tessera::detail::throw_h5_error(static_cast<long long>(tessera_rc_), #expr, __FILE__, \
                                        __LINE__);                                           \
    return tessera_rc_;                                                                      \
  }())
