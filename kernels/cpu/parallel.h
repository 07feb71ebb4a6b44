// tessera::parallel_for: every CPU loop of Tessera that runs on several threads goes through it.
// It is at::parallel_for (torch's intra-op pool: OpenMP, libgomp, in the torch wheels), plus, in a
// ThreadSanitizer build (launch/test --sanitize thread), the pool's fork and join told to TSan:
// libgomp is not instrumented and waits on futexes, so TSan would see no ordering between the
// caller's writes and the workers' reads (or the workers' writes and the caller's reads after the
// loop) and report each loop as a race. Chunks are not ordered with each other, so two chunks
// touching the same memory are still reported.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

#include "kernels/cpu/cpu_build.h"

#ifdef TESSERA_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace tessera {

// Runs f(chunk_begin, chunk_end) over [begin, end) in chunks of at least `grain`, as
// at::parallel_for does (inline when the range is small or the pool has one thread).
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#ifdef TESSERA_THREAD_SANITIZER
  char fork = 0, join = 0;
  __tsan_release(&fork);
  at::parallel_for(begin, end, grain, [&](int64_t chunk_begin, int64_t chunk_end) {
    __tsan_acquire(&fork);
    f(chunk_begin, chunk_end);
    __tsan_release(&join);
  });
  __tsan_acquire(&join);
#else
  at::parallel_for(begin, end, grain, f);
#endif
}

}  // namespace tessera
