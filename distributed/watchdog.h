// Watches every in-flight collective and aborts the job when one exceeds the timeout or reports
// an asynchronous error, so that a stuck or failed peer never leaves ranks waiting forever.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace tessera::distributed {

class Watchdog {
 public:
  // Returns an empty string while healthy, else a description of the failure.
  using HealthCheck = std::function<std::string()>;
  // Called (from the watchdog thread) before the job is aborted, e.g. ncclCommAbort.
  using AbortHook = std::function<void()>;

  explicit Watchdog(double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Registers an operation; it is watched until finish(id) or until `done` returns true.
  uint64_t start(std::string what, std::function<bool()> done = nullptr);
  void finish(uint64_t id);

  // `check` is polled every tick (NCCL's async error query) and `abort` runs before the job is
  // aborted (ncclCommAbort), until remove_hooks(id). Either may be empty.
  uint64_t add_hooks(HealthCheck check, AbortHook abort);
  void remove_hooks(uint64_t id);

  // What the watchdog holds and has done, for tests that assert on it instead of on sleeps:
  // the operations watched now, the checks done (one per tick, every entry and health check),
  // and a wait until `n` more checks have been done (or the watchdog stops).
  size_t watched();
  uint64_t ticks();
  void wait_ticks(uint64_t n);

  // RAII guard for a blocking operation.
  class Scope {
   public:
    Scope(Watchdog& dog, std::string what) : dog_(dog), id_(dog.start(std::move(what))) {}
    ~Scope() { dog_.finish(id_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Watchdog& dog_;
    uint64_t id_;
  };

 private:
  struct Entry {
    std::string what;
    std::chrono::steady_clock::time_point started;
    std::function<bool()> done;
  };
  void run();
  [[noreturn]] void fail(const std::string& message);

  const std::chrono::duration<double> timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable ticked_;  // after each check (wait_ticks)
  uint64_t ticks_ = 0;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Entry> entries_;
  struct Hooks {
    HealthCheck check;
    AbortHook abort;
  };
  std::unordered_map<uint64_t, Hooks> hooks_;
  std::thread thread_;
};

}  // namespace tessera::distributed
