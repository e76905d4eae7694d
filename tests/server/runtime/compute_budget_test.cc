// ComputeBudget hands out what is free, at least one thread, and makes a caller wait when
// nothing is; AvailableCores honours OMP_NUM_THREADS.
#include "server/runtime/compute_budget.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <thread>

#include "absl/time/time.h"
#include "core/util/notification.h"

namespace attnserve::server {
namespace {

constexpr std::chrono::milliseconds kNeverNarrow{0};
constexpr std::chrono::hours kNarrowForAnHour{1};

TEST(ComputeBudgetTest, GrantsWhatIsFreeUpToTheWantedCount) {
  ComputeBudget budget(4, kNeverNarrow);
  EXPECT_EQ(budget.Acquire(3), 3);
  EXPECT_EQ(budget.free_threads(), 1);
  EXPECT_EQ(budget.Acquire(4), 1);  // Only one is free: a smaller team rather than a wait.
  EXPECT_EQ(budget.free_threads(), 0);
  budget.Release(3);
  EXPECT_EQ(budget.Acquire(0), 1);   // Clamped up to one...
  EXPECT_EQ(budget.Acquire(99), 2);  // ...and down to what is free.
  budget.Release(1);
  budget.Release(2);
  budget.Release(1);
  EXPECT_EQ(budget.free_threads(), 4);
}

TEST(ComputeBudgetTest, AfterContentionTeamsAreOneThreadWide) {
  ComputeBudget budget(2, std::chrono::duration_cast<std::chrono::milliseconds>(kNarrowForAnHour));
  EXPECT_EQ(budget.Acquire(2), 2);  // Idle: the whole team.
  budget.Release(2);
  EXPECT_EQ(budget.Acquire(2), 2);
  budget.Release(2);
  const int first = budget.Acquire(1);
  EXPECT_EQ(budget.Acquire(2), 1);  // Asked while another batch computes: busy from now on.
  budget.Release(1);
  budget.Release(first);
  EXPECT_EQ(budget.Acquire(2), 1);  // Still busy within the window, although both are free.
  budget.Release(1);
}

TEST(ComputeBudgetTest, WaitsWhenNothingIsFreeUntilAGrantIsReleased) {
  ComputeBudget budget(1, kNeverNarrow);
  auto held = std::make_unique<ComputeGrant>(budget, 1);
  EXPECT_EQ(held->threads(), 1);
  Notification started, acquired;
  std::atomic<int> granted{0};
  std::thread waiter([&] {
    started.Notify();
    ComputeGrant grant(budget, 1);
    granted = grant.threads();
    acquired.Notify();
  });
  started.WaitForNotification();
  // The waiter cannot get a thread while the grant is held.
  EXPECT_FALSE(acquired.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  held.reset();
  EXPECT_TRUE(acquired.WaitForNotificationWithTimeout(absl::Seconds(30)));
  waiter.join();
  EXPECT_EQ(granted, 1);
  EXPECT_EQ(budget.free_threads(), 1);
}

TEST(AvailableCoresTest, OmpNumThreadsWinsAndEverythingIsAtLeastOne) {
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string restore = saved != nullptr ? saved : "";
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(AvailableCores(), 3);
  unsetenv("OMP_NUM_THREADS");
  EXPECT_GE(AvailableCores(), 1);
  EXPECT_LE(AvailableCores(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  if (saved != nullptr) setenv("OMP_NUM_THREADS", restore.c_str(), 1);
}

}  // namespace
}  // namespace attnserve::server
