#include "server/batching/clock.h"

#include <algorithm>
#include <chrono>

namespace attnserve::batching {
namespace {

// The longest single wait. steady_clock counts nanoseconds in an int64, so a far deadline
// (kNoDeadline - now microseconds) would overflow when converted; waking once an hour instead
// is a harmless spurious return.
constexpr int64_t kMaxWaitMicros = int64_t{3600} * 1000 * 1000;

}  // namespace

Clock* RealClock::Default() {
  static RealClock* const clock = new RealClock();
  return clock;
}

int64_t RealClock::NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void RealClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          int64_t deadline_us) {
  if (deadline_us == kNoDeadline) {
    cv.wait(lock);
    return;
  }
  const int64_t now_us = NowMicros();
  if (deadline_us <= now_us) return;
  // deadline_us > now_us, so the difference cannot overflow unless now_us is negative, which
  // steady_clock (time since boot on Linux) never is.
  const int64_t wait_us = std::min(deadline_us - now_us, kMaxWaitMicros);
  cv.wait_for(lock, std::chrono::microseconds(wait_us));
}

}  // namespace attnserve::batching
