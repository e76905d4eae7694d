// FakeClock: a Clock whose time moves only when a test says so.
//
// Lets batcher tests check "released after max_queue_delay_us, and not before" without sleeping:
// the test advances the time, and BlockUntilWaiters / BlockUntilWaiterWithDeadline tell it when a
// batch thread has looked at the current state and gone to wait.
//
// Thread-safe. Threads waiting in WaitUntil are woken by AdvanceMicros/SetMicros once their
// deadline is reached. A FakeClock must outlive every thread that waits on it.
#ifndef ATTNSERVE_SERVER_BATCHING_FAKE_CLOCK_H_
#define ATTNSERVE_SERVER_BATCHING_FAKE_CLOCK_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "server/batching/clock.h"

namespace attnserve::batching {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_us = 0) : now_us_(start_us) {}

  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  int64_t NowMicros() override;

  // Registers the caller as a waiter until it is notified through `cv` or the time reaches
  // deadline_us. Returns at once when the time already has.
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 int64_t deadline_us) override;

  // Moves the time forward by delta_us (which should be >= 0) and wakes every waiter whose
  // deadline is now reached. Returns once each of them has been notified.
  void AdvanceMicros(int64_t delta_us);
  // Sets the time (a test may move it backwards; no waiter is woken then).
  void SetMicros(int64_t now_us);

  // Blocks until at least n threads are waiting in WaitUntil and have not yet been woken by the
  // clock. A waiter woken through its own condition variable still counts until its thread runs
  // again, so to know that a thread has seen a new state, prefer BlockUntilWaiterWithDeadline.
  void BlockUntilWaiters(int n);
  // Blocks until some thread waits in WaitUntil with exactly this deadline (kNoDeadline for
  // "until notified"), i.e. until it has computed that deadline from the current state.
  void BlockUntilWaiterWithDeadline(int64_t deadline_us);
  // The same, giving up after `timeout` of real time: false if it did (so a broken batcher fails
  // a test instead of hanging it).
  bool BlockUntilWaiters(int n, absl::Duration timeout);
  bool BlockUntilWaiterWithDeadline(int64_t deadline_us, absl::Duration timeout);
  // How many threads wait in WaitUntil now (as counted by BlockUntilWaiters).
  int NumWaiters();

 private:
  // Waits (lock holds mu_) until `done()`, at most `timeout` of real time.
  template <typename Predicate>
  bool AwaitFor(std::unique_lock<std::mutex>& lock, absl::Duration timeout, Predicate done);

  // One thread inside WaitUntil; lives on that thread's stack.
  struct Waiter {
    std::condition_variable* cv;
    std::mutex* mu;  // The caller's mutex, held around notify so no wakeup is lost.
    int64_t deadline_us;
    bool registered = true;  // Still in waiters_ (neither woken by the clock nor returned).
    int notifying = 0;       // Advance calls that hold a pointer to this waiter right now.
  };

  // std:: rather than absl::Mutex so that ThreadSanitizer, which does not see inside the
  // prebuilt abseil, checks the wakeup protocol too.
  std::mutex mu_;
  std::condition_variable changed_;  // Signalled when waiters_ or a `notifying` count changes.
  int64_t now_us_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter*> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_FAKE_CLOCK_H_
