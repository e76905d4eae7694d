// Notification: a one-shot event, with the API of absl::Notification. One thread calls Notify();
// any number of threads wait for it or poll it, and every wait after Notify() returns at once.
//
// Thread-safe. Whatever the notifying thread did before Notify() is visible to a thread once a
// wait returns true or HasBeenNotified() does. The notifier may return from Notify() after a
// waiter has woken and destroyed the Notification (as absl's allows).
//
// Why not absl::Notification: Debian's abseil is not built with ThreadSanitizer, so TSan cannot
// see the synchronisation inside it; it does see std::mutex and std::condition_variable.
#ifndef ATTNSERVE_CORE_UTIL_NOTIFICATION_H_
#define ATTNSERVE_CORE_UTIL_NOTIFICATION_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace attnserve {

class Notification {
 public:
  Notification() = default;
  Notification(const Notification&) = delete;
  Notification& operator=(const Notification&) = delete;

  // Wakes every waiter. Call it once: a second call is a programming error (here, a no-op).
  void Notify() {
    // Under mu_: a woken waiter cannot return (and destroy *this) before notify_all is done.
    std::lock_guard<std::mutex> lock(mu_);
    notified_ = true;
    cv_.notify_all();
  }

  bool HasBeenNotified() const {
    std::lock_guard<std::mutex> lock(mu_);
    return notified_;
  }

  void WaitForNotification() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return notified_; });
  }

  // Waits at most `timeout`; true when notified. A timeout <= 0 only checks; one too long for
  // the steady clock (e.g. absl::InfiniteDuration()) waits forever.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    std::unique_lock<std::mutex> lock(mu_);
    if (timeout <= absl::ZeroDuration()) return notified_;
    const auto now = std::chrono::steady_clock::now();
    const std::chrono::nanoseconds wait = absl::ToChronoNanoseconds(timeout);  // Saturates.
    if (wait >= std::chrono::steady_clock::time_point::max() - now) {
      cv_.wait(lock, [this] { return notified_; });
      return true;
    }
    return cv_.wait_until(lock, now + wait, [this] { return notified_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_NOTIFICATION_H_
