#include "framework/thread_invariance.h"

#include <dlfcn.h>

namespace tessera {

namespace {
// oneMKL's C functions under the names torch's statically linked oneMKL exports them (its
// lower-case mkl_set_num_threads_local there is the Fortran one, which takes a pointer).
using CbwrGet = int (*)(int);
using SetThreadsLocal = int (*)(int);
constexpr int kCbwrAll = ~0;  // MKL_CBWR_ALL: the whole setting
constexpr int kCbwrOff = 0;   // MKL_CBWR_OFF
constexpr int kCbwrBranchOff = 1;  // MKL_CBWR_BRANCH_OFF

template <typename F>
F mkl_function(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

SetThreadsLocal set_threads_local() {
  static const SetThreadsLocal f = mkl_function<SetThreadsLocal>("MKL_Set_Num_Threads_Local");
  return f;
}
}  // namespace

BlasMode blas_mode() {
  const auto get = mkl_function<CbwrGet>("mkl_serv_cbwr_get");  // mkl_cbwr_get
  if (get == nullptr) return BlasMode::Unknown;
  const int settings = get(kCbwrAll);
  if (settings < 0) return BlasMode::Unknown;
  return settings == kCbwrOff || settings == kCbwrBranchOff ? BlasMode::NotReproducible
                                                            : BlasMode::Reproducible;
}

bool SingleThreadedBlas::available() { return set_threads_local() != nullptr; }

SingleThreadedBlas::SingleThreadedBlas() {
  if (const SetThreadsLocal set = set_threads_local()) previous_ = set(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (previous_ >= 0) set_threads_local()(previous_);
}

}  // namespace tessera
