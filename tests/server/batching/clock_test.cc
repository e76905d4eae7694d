// FakeClock and RealClock: waits end at the deadline or on notify, never earlier by the clock,
// and no wakeup is lost. Threads are synchronised with the fake clock's waiter counts, not sleeps.
#include "server/batching/clock.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "absl/time/time.h"
#include "core/util/notification.h"
#include "gtest/gtest.h"
#include "server/batching/fake_clock.h"

namespace attnserve::batching {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);  // Only a broken clock gets near this.

// A thread that waits on the clock until `deadline_us` for the condition "woken", like a batch
// thread, and records the clock time when it is done.
class WaitingThread {
 public:
  WaitingThread(Clock* clock, int64_t deadline_us)
      : thread_([this, clock, deadline_us] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!woken_ && clock->NowMicros() < deadline_us) {
            clock->WaitUntil(cv_, lock, deadline_us);
          }
          finished_at_us_ = clock->NowMicros();
          done_.Notify();
        }) {}
  ~WaitingThread() { thread_.join(); }

  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken_ = true;
    }
    cv_.notify_all();
  }
  bool done() const { return done_.HasBeenNotified(); }
  bool WaitDone() { return done_.WaitForNotificationWithTimeout(kTimeout); }
  int64_t finished_at_us() const { return finished_at_us_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false;
  std::atomic<int64_t> finished_at_us_{-1};
  Notification done_;
  std::thread thread_;  // Last: starts once the members it uses exist.
};

TEST(FakeClockTest, StartsWhereToldAndMovesOnlyWhenTold) {
  FakeClock clock(500);
  EXPECT_EQ(clock.NowMicros(), 500);
  EXPECT_EQ(clock.NowMicros(), 500);
  clock.AdvanceMicros(25);
  EXPECT_EQ(clock.NowMicros(), 525);
  clock.SetMicros(10);
  EXPECT_EQ(clock.NowMicros(), 10);
}

TEST(FakeClockTest, WaitUntilReturnsAtOnceWhenDeadlinePassed) {
  FakeClock clock(100);
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  clock.WaitUntil(cv, lock, 100);  // Would block forever (nobody notifies) if it waited.
  clock.WaitUntil(cv, lock, 50);
  EXPECT_TRUE(lock.owns_lock());
  EXPECT_EQ(clock.NumWaiters(), 0);
}

TEST(FakeClockTest, WaiterWakesAtItsDeadlineAndNotBefore) {
  FakeClock clock(0);
  WaitingThread waiter(&clock, 100);
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(100, kTimeout));
  clock.AdvanceMicros(99);
  // Still registered: the clock did not wake it, and it has no other reason to return.
  EXPECT_EQ(clock.NumWaiters(), 1);
  EXPECT_FALSE(waiter.done());
  clock.AdvanceMicros(1);
  ASSERT_TRUE(waiter.WaitDone());
  EXPECT_EQ(waiter.finished_at_us(), 100);
  EXPECT_EQ(clock.NumWaiters(), 0);
}

TEST(FakeClockTest, SetMicrosWakesEveryDueWaiterOnly) {
  FakeClock clock(0);
  WaitingThread early(&clock, 10);
  WaitingThread late(&clock, 1000);
  WaitingThread forever(&clock, kNoDeadline);
  ASSERT_TRUE(clock.BlockUntilWaiters(3, kTimeout));
  clock.SetMicros(10);
  ASSERT_TRUE(early.WaitDone());
  EXPECT_EQ(early.finished_at_us(), 10);
  EXPECT_FALSE(late.done());
  EXPECT_FALSE(forever.done());
  EXPECT_EQ(clock.NumWaiters(), 2);  // Woken waiters stop counting at once.
  clock.SetMicros(5000);
  ASSERT_TRUE(late.WaitDone());
  EXPECT_FALSE(forever.done());
  forever.Wake();
  ASSERT_TRUE(forever.WaitDone());
  EXPECT_EQ(forever.finished_at_us(), 5000);
}

TEST(FakeClockTest, NotifyWakesWaiterBeforeDeadline) {
  FakeClock clock(0);
  WaitingThread waiter(&clock, 100);
  ASSERT_TRUE(clock.BlockUntilWaiters(1, kTimeout));
  waiter.Wake();
  ASSERT_TRUE(waiter.WaitDone());
  EXPECT_EQ(waiter.finished_at_us(), 0);
}

TEST(FakeClockTest, BlockUntilGivesUpAfterTimeout) {
  FakeClock clock(0);
  EXPECT_FALSE(clock.BlockUntilWaiters(1, absl::Milliseconds(1)));
  EXPECT_FALSE(clock.BlockUntilWaiterWithDeadline(7, absl::Milliseconds(1)));
}

// Many waiters racing with many advances: each waiter must finish once the clock passes its
// deadline. A lost wakeup (time checked, then Advance, then cv.wait) would hang WaitDone.
TEST(FakeClockTest, NoWakeupLostUnderRacingAdvances) {
  FakeClock clock(0);
  constexpr int kWaiters = 16;
  std::vector<std::unique_ptr<WaitingThread>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::make_unique<WaitingThread>(&clock, 1 + i % 4));
  }
  for (int step = 0; step < 4; ++step) clock.AdvanceMicros(1);
  for (auto& waiter : waiters) ASSERT_TRUE(waiter->WaitDone());
}

TEST(RealClockTest, IsMonotonicAndHonoursDeadlines) {
  Clock* clock = RealClock::Default();
  EXPECT_EQ(clock, RealClock::Default());
  const int64_t start_us = clock->NowMicros();
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  clock->WaitUntil(cv, lock, start_us - 1);  // Past: returns at once.
  // Nobody notifies, so only the deadline (or a spurious return) ends each wait.
  const int64_t deadline_us = clock->NowMicros() + 2000;
  while (clock->NowMicros() < deadline_us) clock->WaitUntil(cv, lock, deadline_us);
  EXPECT_TRUE(lock.owns_lock());
  EXPECT_GE(clock->NowMicros(), deadline_us);
  EXPECT_GE(clock->NowMicros(), start_us);
}

}  // namespace
}  // namespace attnserve::batching
