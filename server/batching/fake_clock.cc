#include "server/batching/fake_clock.h"

#include <algorithm>
#include <chrono>

namespace attnserve::batching {

// Lock order: a waiter's own mutex (held by WaitUntil's caller) before mu_. SetMicros therefore
// never holds mu_ while it takes a waiter's mutex: it unregisters the due waiters under mu_,
// marks them `notifying` so they cannot leave WaitUntil (and free their Waiter) meanwhile, and
// notifies them after releasing mu_.

int64_t FakeClock::NowMicros() {
  std::lock_guard<std::mutex> lock(mu_);
  return now_us_;
}

void FakeClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          int64_t deadline_us) {
  Waiter waiter{.cv = &cv, .mu = lock.mutex(), .deadline_us = deadline_us};
  {
    std::lock_guard<std::mutex> clock_lock(mu_);
    if (now_us_ >= deadline_us) return;
    // Registered while the caller's mutex is held and under mu_: a SetMicros that passes the
    // deadline after this point sees the waiter, and its notify needs the caller's mutex, which
    // cv.wait only releases once this thread is asleep.
    waiters_.push_back(&waiter);
  }
  changed_.notify_all();
  cv.wait(lock);
  {
    std::lock_guard<std::mutex> clock_lock(mu_);
    if (waiter.registered) {
      waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &waiter));
      waiter.registered = false;
    }
    if (waiter.notifying == 0) return;
  }
  // A SetMicros is about to lock our mutex to notify us: let it, then wait until it is done
  // with `waiter` before this stack frame goes away.
  lock.unlock();
  {
    std::unique_lock<std::mutex> clock_lock(mu_);
    changed_.wait(clock_lock, [&] { return waiter.notifying == 0; });
  }
  lock.lock();
}

void FakeClock::AdvanceMicros(int64_t delta_us) {
  int64_t now_us;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now_us = now_us_ + delta_us;
  }
  SetMicros(now_us);
}

void FakeClock::SetMicros(int64_t now_us) {
  std::vector<Waiter*> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now_us_ = now_us;
    auto keep = std::stable_partition(waiters_.begin(), waiters_.end(),
                                      [&](Waiter* w) { return w->deadline_us > now_us; });
    due.assign(keep, waiters_.end());
    waiters_.erase(keep, waiters_.end());
    for (Waiter* w : due) {
      w->registered = false;
      ++w->notifying;
    }
  }
  if (due.empty()) return;
  for (Waiter* w : due) {
    std::lock_guard<std::mutex> waiter_lock(*w->mu);
    w->cv->notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Waiter* w : due) --w->notifying;
  }
  changed_.notify_all();
}

void FakeClock::BlockUntilWaiters(int n) { BlockUntilWaiters(n, absl::InfiniteDuration()); }

void FakeClock::BlockUntilWaiterWithDeadline(int64_t deadline_us) {
  BlockUntilWaiterWithDeadline(deadline_us, absl::InfiniteDuration());
}

bool FakeClock::BlockUntilWaiters(int n, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return AwaitFor(lock, timeout, [&] { return static_cast<int>(waiters_.size()) >= n; });
}

bool FakeClock::BlockUntilWaiterWithDeadline(int64_t deadline_us, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return AwaitFor(lock, timeout, [&] {
    return std::any_of(waiters_.begin(), waiters_.end(),
                       [&](const Waiter* w) { return w->deadline_us == deadline_us; });
  });
}

template <typename Predicate>
bool FakeClock::AwaitFor(std::unique_lock<std::mutex>& lock, absl::Duration timeout,
                         Predicate done) {
  if (timeout == absl::InfiniteDuration()) {
    changed_.wait(lock, done);
    return true;
  }
  return changed_.wait_for(lock, absl::ToChronoMicroseconds(timeout), done);
}

int FakeClock::NumWaiters() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(waiters_.size());
}

}  // namespace attnserve::batching
