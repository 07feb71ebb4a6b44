// tessera::parallel_for: every CPU loop of Tessera that runs on several threads goes through it.
// It is at::parallel_for (torch's intra-op pool: OpenMP, libgomp, in the torch wheels), plus, in a
// ThreadSanitizer build (launch/test --sanitize thread), the pool's fork and join told to TSan:
// libgomp is not instrumented and waits on futexes, so TSan would see no ordering between the
// caller's writes and the workers' reads (or the workers' writes and the caller's reads after the
// loop) and report each loop as a race. Chunks are not ordered with each other, so two chunks
// touching the same memory are still reported.
#pragma once

#include <ATen/Parallel.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

#include "kernels/cpu/cpu_build.h"

#ifdef TESSERA_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace tessera {

namespace detail {
// Threads for Tessera's own loops on this thread while torch's ops are pinned to one (the bitwise
// path's TorchOnOneThread guard); 0: torch's pool as it is.
inline int& own_loop_threads() {
  thread_local int threads = 0;
  return threads;
}

#ifdef _OPENMP
// [begin, end) in at most `threads` chunks of at least `grain` on OpenMP threads of torch's
// runtime, split as at::parallel_for splits (the chunks from the team OpenMP actually gives, a
// constant num_threads so that libgomp keeps its pool), the first exception rethrown after the
// join.
template <class F>
void own_parallel_for(int64_t begin, int64_t end, int64_t grain, int threads, const F& f) {
  const int64_t n = end - begin;
  std::exception_ptr error;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
#pragma omp parallel num_threads(threads)
  {
    const int64_t team = omp_get_num_threads();
    const int64_t chunks = std::min<int64_t>(team, (n + grain - 1) / grain);
    const int64_t chunk = (n + chunks - 1) / chunks;
    const int64_t tid = omp_get_thread_num();
    const int64_t first = begin + tid * chunk;
    if (tid < chunks && first < end) {
      try {
        f(first, std::min(end, first + chunk));
      } catch (...) {
        if (!failed.test_and_set()) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}
#endif
}  // namespace detail

// Runs f(chunk_begin, chunk_end) over [begin, end) in chunks of at least `grain`, as
// at::parallel_for does (inline when the range is small or the pool has one thread). While
// torch's own ops are pinned to one thread (TorchOnOneThread), Tessera's loops keep the threads
// they had.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#ifdef TESSERA_THREAD_SANITIZER
  char fork = 0, join = 0;
  __tsan_release(&fork);
  auto body = [&](int64_t chunk_begin, int64_t chunk_end) {
    __tsan_acquire(&fork);
    f(chunk_begin, chunk_end);
    __tsan_release(&join);
  };
#else
  const F& body = f;
#endif
#ifdef _OPENMP
  const int own = detail::own_loop_threads();
  if (own > 1 && end - begin > std::max<int64_t>(grain, 1) && !omp_in_parallel())
    detail::own_parallel_for(begin, end, std::max<int64_t>(grain, 1), own, body);
  else
    at::parallel_for(begin, end, grain, body);
#else
  at::parallel_for(begin, end, grain, body);
#endif
#ifdef TESSERA_THREAD_SANITIZER
  __tsan_acquire(&join);
#endif
}

}  // namespace tessera
