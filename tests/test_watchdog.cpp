// Tests of the collective watchdog: finished, scoped and self-completing operations pass; a stuck
// operation or a failed health check ends the process with exit code 3 after the abort hooks.
// And AbortOnce, the communicator handle that the training thread, the watchdog and the destructor
// may each try to end.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "distributed/abort_once.h"
#include "distributed/errors.h"
#include "distributed/watchdog.h"

namespace tessera::distributed {
namespace {

// The deadline of the death tests, which wait for it to pass: short, to keep them fast.
constexpr double kTimeoutS = 0.3;
// The deadline of the tests whose operations must not abort: far past anything they do, so a
// slow machine (a sanitizer, a loaded CI) cannot end them; they assert on the watchdog's state
// after whole ticks (Watchdog::wait_ticks), not on sleeps.
constexpr double kNeverS = 600.0;

void sleep_for(std::chrono::milliseconds duration) { std::this_thread::sleep_for(duration); }

class WatchdogTest : public testing::Test {
 protected:
  // The watchdog owns a thread: a death test must re-execute the binary, not fork it.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(WatchdogTest, FinishedOperationIsNoLongerWatched) {
  Watchdog dog(kNeverS);
  for (int i = 0; i < 5; ++i) {
    const uint64_t id = dog.start("quick allreduce");
    EXPECT_EQ(dog.watched(), 1u);
    dog.finish(id);
    EXPECT_EQ(dog.watched(), 0u) << "an entry left behind would abort once its deadline passed";
  }
  dog.wait_ticks(2);
  EXPECT_EQ(dog.watched(), 0u);
}

TEST_F(WatchdogTest, IdsAreDistinct) {
  Watchdog dog(kNeverS);
  const uint64_t a = dog.start("a");
  const uint64_t b = dog.start("b");
  const uint64_t h = dog.add_hooks(nullptr, nullptr);
  EXPECT_NE(a, b);
  EXPECT_NE(a, h);
  EXPECT_NE(b, h);
  EXPECT_EQ(dog.watched(), 2u);
  dog.finish(a);
  dog.finish(b);
  dog.remove_hooks(h);
  EXPECT_EQ(dog.watched(), 0u);
}

TEST_F(WatchdogTest, ScopeFinishesItsOperation) {
  Watchdog dog(kNeverS);
  for (int i = 0; i < 3; ++i) {
    Watchdog::Scope scope(dog, "scoped broadcast");
    EXPECT_EQ(dog.watched(), 1u);
  }
  EXPECT_EQ(dog.watched(), 0u);
}

TEST_F(WatchdogTest, OperationWhoseDoneReturnsTrueIsDropped) {
  std::atomic<int> polls{0};  // declared first: outlives the watchdog that polls it
  Watchdog dog(kNeverS);
  dog.start("async allreduce", [&polls] {
    ++polls;
    return true;
  });
  dog.wait_ticks(2);  // never finish()ed: the first check polls `done` and drops the entry
  EXPECT_EQ(dog.watched(), 0u);
  EXPECT_EQ(polls.load(), 1);
  dog.wait_ticks(2);
  EXPECT_EQ(polls.load(), 1) << "a dropped operation is polled no more";
}

TEST_F(WatchdogTest, DoneBecomingTrueLaterIsDropped) {
  std::atomic<bool> complete{false};
  std::atomic<int> polls{0};
  Watchdog dog(kNeverS);
  dog.start("async reduce", [&] {
    ++polls;
    return complete.load();
  });
  dog.wait_ticks(2);
  EXPECT_EQ(dog.watched(), 1u) << "still in flight";
  EXPECT_GE(polls.load(), 2);
  complete = true;
  dog.wait_ticks(2);
  EXPECT_EQ(dog.watched(), 0u);
}

TEST_F(WatchdogTest, HealthyCheckAndRemovedHooksDoNotAbort) {
  std::atomic<int> checks{0};
  std::atomic<int> aborts{0};
  Watchdog dog(kNeverS);
  const uint64_t id = dog.add_hooks(
      [&checks] {
        ++checks;
        return std::string();
      },
      [&aborts] { ++aborts; });
  dog.wait_ticks(3);
  EXPECT_GE(checks.load(), 2) << "the health check is polled every tick";
  dog.remove_hooks(id);
  const int after_removal = checks.load();
  dog.wait_ticks(2);
  EXPECT_EQ(checks.load(), after_removal) << "a removed check is polled no more";
  EXPECT_EQ(aborts.load(), 0);
}

// The destructor ends the watchdog's thread without waiting for the 600 s timeout: a tenth of
// it is a bound that no slow machine misses (TSan, oversubscribed ranks; the thread ticks every
// 100 ms) and that a destructor waiting for the timeout cannot meet.
TEST_F(WatchdogTest, DestructorStopsPromptly) {
  const auto start = std::chrono::steady_clock::now();
  { Watchdog dog(600.0); }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

using WatchdogDeathTest = WatchdogTest;

TEST_F(WatchdogDeathTest, UnfinishedOperationExitsWith3) {
  EXPECT_EXIT(
      {
        Watchdog dog(kTimeoutS);
        dog.start("allreduce of step 17");
        sleep_for(std::chrono::seconds(10));
        std::fprintf(stderr, "watchdog never fired\n");
        std::_Exit(0);
      },
      testing::ExitedWithCode(kExitDistributed),
      "allreduce of step 17.*did not complete within 0\\.3 s");
}

TEST_F(WatchdogDeathTest, SlowScopeExitsWith3) {
  EXPECT_EXIT(
      {
        Watchdog dog(kTimeoutS);
        Watchdog::Scope scope(dog, "stuck barrier");
        sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      testing::ExitedWithCode(kExitDistributed), "stuck barrier.*did not complete within");
}

TEST_F(WatchdogDeathTest, DoneReturningFalseStillTimesOut) {
  EXPECT_EXIT(
      {
        Watchdog dog(kTimeoutS);
        dog.start("pending nccl op", [] { return false; });
        sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      testing::ExitedWithCode(kExitDistributed), "pending nccl op.*did not complete within");
}

TEST_F(WatchdogDeathTest, FailedHealthCheckExitsWith3) {
  EXPECT_EXIT(
      {
        Watchdog dog(kTimeoutS);
        dog.add_hooks([] { return std::string("NCCL async error: remote process exited"); },
                      nullptr);
        sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      testing::ExitedWithCode(kExitDistributed), "NCCL async error: remote process exited");
}

TEST_F(WatchdogDeathTest, AbortHooksRunBeforeExit) {
  EXPECT_EXIT(
      {
        Watchdog dog(kTimeoutS);
        dog.add_hooks(nullptr, [] {
          std::fprintf(stderr, "ABORT-HOOK-MARKER ran\n");
          std::fflush(stderr);
        });
        dog.start("hung allgather");
        sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      testing::ExitedWithCode(kExitDistributed),
      // The hook's marker comes before the abort message.
      "ABORT-HOOK-MARKER ran(.|\n)*hung allgather.*did not complete within");
}

TEST_F(WatchdogDeathTest, EveryAbortHookRunsOnHealthFailure) {
  EXPECT_EXIT(
      {
        Watchdog dog(kTimeoutS);
        dog.add_hooks(nullptr, [] { std::fprintf(stderr, "HOOK-ONE\n"); });
        dog.add_hooks([] { return std::string("peer 2 lost"); },
                      [] { std::fprintf(stderr, "HOOK-TWO\n"); });
        sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      testing::ExitedWithCode(kExitDistributed),
      "(HOOK-ONE(.|\n)*HOOK-TWO|HOOK-TWO(.|\n)*HOOK-ONE)(.|\n)*peer 2 lost");
}

TEST_F(WatchdogDeathTest, RemovedHealthCheckNoLongerFires) {
  // The process lives while the failing check is removed, then a stuck op ends it: the message
  // must be the timeout, not the removed check's text.
  EXPECT_EXIT(
      {
        Watchdog dog(kTimeoutS);
        const uint64_t id =
            dog.add_hooks([] { return std::string("REMOVED-CHECK"); },
                          [] { std::fprintf(stderr, "REMOVED-HOOK\n"); });
        dog.remove_hooks(id);
        dog.start("final op");
        sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      testing::ExitedWithCode(kExitDistributed),
      "^tessera: rank -1: collective 'final op' did not complete within");
}

// Eight threads abort while eight poll: the abort runs once, and no poll runs on an ended handle
// (each poll checks the "freed" flag that the abort sets, as NCCL frees the communicator).
TEST(AbortOnceTest, ConcurrentAbortsRunOnceAndNoPollFollows) {
  for (int round = 0; round < 20; ++round) {
    AbortOnce handle;
    std::atomic<int> aborts{0}, ended_by{0}, polls_after_free{0}, polls{0};
    std::atomic<bool> freed{false}, go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        while (!go) std::this_thread::yield();
        if (handle.abort([&] { ++aborts; freed = true; })) ++ended_by;
      });
      threads.emplace_back([&] {
        while (!go) std::this_thread::yield();
        for (int i = 0; i < 200; ++i)
          handle.if_live([&] { ++polls; if (freed) ++polls_after_free; });
      });
    }
    go = true;
    for (auto& t : threads) t.join();
    EXPECT_EQ(aborts.load(), 1);
    EXPECT_EQ(ended_by.load(), 1);
    EXPECT_EQ(polls_after_free.load(), 0);
    EXPECT_FALSE(handle.live());
    EXPECT_TRUE(handle.aborted());
    EXPECT_FALSE(handle.if_live([&] { ++polls_after_free; }));
    EXPECT_EQ(polls_after_free.load(), 0);
  }
}

TEST(AbortOnceTest, DestroyAfterAbortAndAbortAfterDestroyDoNothing) {
  int aborts = 0, destroys = 0;
  AbortOnce aborted;
  EXPECT_TRUE(aborted.abort([&] { ++aborts; }));
  EXPECT_FALSE(aborted.destroy([&] { ++destroys; }));
  EXPECT_FALSE(aborted.abort([&] { ++aborts; }));
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(destroys, 0);

  AbortOnce destroyed;
  EXPECT_TRUE(destroyed.live());
  EXPECT_TRUE(destroyed.destroy([&] { ++destroys; }));
  EXPECT_FALSE(destroyed.abort([&] { ++aborts; }));
  EXPECT_FALSE(destroyed.aborted());
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(destroys, 1);
}

// The shape of NcclCommunicator: a failed call aborts the handle on the training thread, then the
// watchdog's health check fails and runs its abort hook, which must find the handle ended.
TEST_F(WatchdogDeathTest, AbortHookAfterAnAbortFindsTheHandleEnded) {
  EXPECT_EXIT(
      {
        Watchdog dog(kTimeoutS);
        auto handle = std::make_shared<AbortOnce>();
        dog.add_hooks([] { return std::string("async error"); },
                      [handle] {
                        const bool ended_now = handle->abort([] {});
                        std::fprintf(stderr, "hook ended the handle: %s\n",
                                     ended_now ? "yes" : "no");
                      });
        handle->abort([] {});  // the training thread's failed call
        sleep_for(std::chrono::seconds(10));
        std::_Exit(0);
      },
      testing::ExitedWithCode(kExitDistributed), "hook ended the handle: no");
}

}  // namespace
}  // namespace tessera::distributed
