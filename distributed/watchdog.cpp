// The watchdog thread: polls in-flight collectives and health checks, and aborts the whole job
// (abort hooks, then MPI_Abort with exit code 3) on a timeout or an asynchronous error.
#include "distributed/watchdog.h"

#include <sstream>

#include "distributed/errors.h"
#include "distributed/process_context.h"

namespace tessera::distributed {

namespace {
// How often the thread looks: short enough that a failure is reported within a second, long
// enough to cost nothing measurable.
constexpr std::chrono::milliseconds kTick{100};
}  // namespace

Watchdog::Watchdog(double timeout_s)
    : timeout_(timeout_s), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

uint64_t Watchdog::start(std::string what, std::function<bool()> done) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{std::move(what), std::chrono::steady_clock::now(), std::move(done)});
  return id;
}

void Watchdog::finish(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.erase(id);
}

uint64_t Watchdog::add_hooks(HealthCheck check, AbortHook abort) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  hooks_.emplace(id, Hooks{std::move(check), std::move(abort)});
  return id;
}

void Watchdog::remove_hooks(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  hooks_.erase(id);
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kTick);
    if (stopping_) break;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.done && it->second.done()) {
        it = entries_.erase(it);
        continue;
      }
      const std::chrono::duration<double> age = now - it->second.started;
      if (age > timeout_) {
        std::ostringstream out;
        out << "collective '" << it->second.what << "' did not complete within "
            << timeout_.count() << " s (distributed.timeout_s); a peer is dead or stuck";
        fail(out.str());
      }
      ++it;
    }
    for (const auto& [id, hooks] : hooks_) {
      if (!hooks.check) continue;
      const std::string problem = hooks.check();
      if (!problem.empty()) fail(problem);
    }
    ++ticks_;
    ticked_.notify_all();
  }
  ticked_.notify_all();  // a waiter returns when the watchdog stops
}

size_t Watchdog::watched() {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

uint64_t Watchdog::ticks() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ticks_;
}

void Watchdog::wait_ticks(uint64_t n) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = ticks_ + n;
  ticked_.wait(lock, [&] { return ticks_ >= target || stopping_; });
}

void Watchdog::fail(const std::string& message) {
  // Called with mutex_ held; the process ends here, so the lock is never released.
  for (const auto& [id, hooks] : hooks_)
    if (hooks.abort) hooks.abort();
  ProcessContext::abort_job(kExitDistributed, message);
}

}  // namespace tessera::distributed
