// Clock: where the batcher reads the time and waits for it.
//
// The batcher never reads std::chrono directly, so tests can drive time with FakeClock
// (fake_clock.h) instead of sleeping. Times are microseconds on a monotonic scale whose origin
// means nothing; only differences matter.
//
// Implementations are thread-safe: every method may be called from any thread.
#ifndef ATTNSERVE_SERVER_BATCHING_CLOCK_H_
#define ATTNSERVE_SERVER_BATCHING_CLOCK_H_

#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>

namespace attnserve::batching {

// WaitUntil's deadline meaning "no timeout: wait until notified".
inline constexpr int64_t kNoDeadline = std::numeric_limits<int64_t>::max();

class Clock {
 public:
  virtual ~Clock() = default;

  // The current time in microseconds. Never decreases (FakeClock: unless the test sets it back).
  virtual int64_t NowMicros() = 0;

  // Waits on `cv` until it is notified or this clock reaches `deadline_us` (kNoDeadline: no
  // timeout). `lock` must hold the mutex that guards the caller's condition, exactly as for
  // cv.wait; it is held again on return. Returns at once if the deadline has passed. Spurious
  // returns are allowed, so callers re-check their condition and the time in a loop. Cannot
  // fail.
  virtual void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         int64_t deadline_us) = 0;
};

// The machine's monotonic clock (std::chrono::steady_clock), in microseconds.
class RealClock final : public Clock {
 public:
  // A process-wide instance; never destroyed, so it outlives every batcher.
  static Clock* Default();

  int64_t NowMicros() override;
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 int64_t deadline_us) override;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_CLOCK_H_
