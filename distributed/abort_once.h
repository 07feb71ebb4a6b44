// AbortOnce: the life of a communication library's communicator handle (an ncclComm_t) that three
// parties may end: a failed call on the training thread, the watchdog's abort hook on its thread,
// and the owner's destructor. The handle ends once, by abort or by destroy, and nothing touches
// it after that: NCCL frees a communicator in ncclCommAbort, so a second abort, a poll of its
// async error or an ncclCommDestroy after it would use freed memory.
#pragma once

#include <functional>
#include <mutex>

namespace tessera::distributed {

class AbortOnce {
 public:
  // Runs `use` (a poll of the handle) while it is live, holding off any abort until it returns.
  // False when the handle has ended.
  bool if_live(const std::function<void()>& use) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ended_) return false;
    use();
    return true;
  }
  // Ends a live handle with `abort`. True when this call ended it; false when it had ended.
  bool abort(const std::function<void()>& abort) { return end(abort, /*aborting=*/true); }
  // Ends a live handle with `destroy` (the orderly teardown); false when it had ended (aborted).
  bool destroy(const std::function<void()>& destroy) { return end(destroy, /*aborting=*/false); }

  bool live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !ended_;
  }
  bool aborted() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return aborted_;
  }

 private:
  bool end(const std::function<void()>& how, bool aborting) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ended_) return false;
    ended_ = true;
    aborted_ = aborting;
    how();
    return true;
  }

  mutable std::mutex mutex_;
  bool ended_ = false;
  bool aborted_ = false;
};

}  // namespace tessera::distributed
