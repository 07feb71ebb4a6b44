#include "framework/thread_invariance.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include "kernels/cpu/parallel.h"

namespace tessera {

namespace {
// oneMKL's mkl_cbwr_get, under the name torch's statically linked oneMKL exports it.
using CbwrGet = int (*)(int);
constexpr int kCbwrAll = ~0;  // MKL_CBWR_ALL: the whole setting
constexpr int kCbwrOff = 0;   // MKL_CBWR_OFF
constexpr int kCbwrBranchOff = 1;  // MKL_CBWR_BRANCH_OFF

template <typename F>
F mkl_function(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
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

TorchOnOneThread::TorchOnOneThread()
    : torch_threads_(at::get_num_threads()), own_loop_threads_(detail::own_loop_threads()) {
  if (own_loop_threads_ == 0) detail::own_loop_threads() = torch_threads_;
  at::set_num_threads(1);
}

TorchOnOneThread::~TorchOnOneThread() {
  at::set_num_threads(torch_threads_);
  detail::own_loop_threads() = own_loop_threads_;
}

}  // namespace tessera
