// tessera::parallel_for (kernels/cpu/parallel.h): every index once, the caller sees the chunks'
// writes, and in a ThreadSanitizer build the fork and join are known to TSan (no report for a
// correct loop) while a race between two chunks is still reported.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace tessera {
namespace {

constexpr int64_t kCount = 100000, kGrain = 1000;

// How many distinct threads ran the chunks of one loop over kCount indices on a pool of `pool`.
size_t threads_used(int pool = 2) {
  at::set_num_threads(pool);
  std::mutex mutex;
  std::set<std::thread::id> ids;
  tessera::parallel_for(0, kCount, kGrain, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    ids.insert(std::this_thread::get_id());
  });
  return ids.size();
}

TEST(ParallelFor, EveryIndexOnceAndTheCallerSeesTheWrites) {
  at::set_num_threads(2);
  for (int round = 0; round < 3; ++round) {  // the pool's threads are reused between loops
    std::vector<int64_t> values(kCount, -1);  // written by the caller before the loop
    std::vector<int> hits(kCount, 0);
    tessera::parallel_for(0, kCount, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        EXPECT_EQ(values[i], -1);
        values[i] = i * 3 + round;
        ++hits[i];
      }
    });
    for (int64_t i = 0; i < kCount; ++i) {  // read by the caller after the loop
      ASSERT_EQ(hits[i], 1) << "index " << i;
      ASSERT_EQ(values[i], i * 3 + round) << "index " << i;
    }
  }
  int64_t calls = 0;
  tessera::parallel_for(5, 5, 1, [&](int64_t, int64_t) { ++calls; });  // empty range: no call
  EXPECT_EQ(calls, 0);
  std::printf("chunks of one loop ran on %zu thread(s) of a pool of 2\n", threads_used());
}

#if defined(__GNUC__) && !defined(__clang__)
// The GCC build compiles Tessera with OpenMP (CMakeLists.txt, "Threads"): a loop's chunks run on
// torch's pool, whose size at::set_num_threads sets for torch's ops and Tessera's loops alike (one
// OpenMP runtime, the wheel's libgomp). Without -fopenmp, ATen's header runs them on the caller.
TEST(ParallelFor, GccBuildRunsTheChunksOnTorchsPool) {
  const int threads = at::get_num_threads();
  EXPECT_EQ(threads_used(2), 2u) << "Tessera's loops run serially: is -fopenmp missing?";
  EXPECT_EQ(threads_used(1), 1u) << "at::set_num_threads(1) does not reach Tessera's loops";
  EXPECT_EQ(threads_used(3), 3u);
  at::set_num_threads(threads);
}
#endif

#ifdef TESSERA_THREAD_SANITIZER
// Chunks on two threads add to one counter without a lock: TSan must report it, or the fork and
// join annotations would be hiding the races they are meant to let through.
void racy_loop() {
  at::set_num_threads(2);
  int64_t shared = 0;
  for (int round = 0; round < 5; ++round)
    tessera::parallel_for(0, kCount, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) shared += i;
    });
  if (shared < 0) std::abort();
}

TEST(ParallelForDeathTest, ThreadSanitizerStillSeesARaceBetweenChunks) {
  if (threads_used() < 2)
    GTEST_SKIP() << "this build runs tessera::parallel_for's chunks on one thread (its code is "
                    "compiled without OpenMP, so ATen's header takes its serial branch): no two "
                    "chunks can race";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(racy_loop(), "ThreadSanitizer: data race");
}
#endif

}  // namespace
}  // namespace tessera
