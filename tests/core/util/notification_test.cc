// Notification: the one-shot event the server and tests wait on (std:: based, so ThreadSanitizer
// sees it). Run under TSan by deploy/test-sanitizers.sh.
#include "core/util/notification.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace attnserve {
namespace {

TEST(NotificationTest, StartsUnnotifiedAndATimedWaitGivesUp) {
  Notification notification;
  EXPECT_FALSE(notification.HasBeenNotified());
  EXPECT_FALSE(notification.WaitForNotificationWithTimeout(absl::Milliseconds(10)));
  EXPECT_FALSE(notification.WaitForNotificationWithTimeout(absl::ZeroDuration()));
  EXPECT_FALSE(notification.WaitForNotificationWithTimeout(-absl::Seconds(1)));
}

TEST(NotificationTest, EveryWaitReturnsAtOnceAfterNotify) {
  Notification notification;
  notification.Notify();
  EXPECT_TRUE(notification.HasBeenNotified());
  notification.WaitForNotification();
  EXPECT_TRUE(notification.WaitForNotificationWithTimeout(absl::ZeroDuration()));
  EXPECT_TRUE(notification.WaitForNotificationWithTimeout(absl::InfiniteDuration()));
  notification.Notify();  // A second call changes nothing.
  EXPECT_TRUE(notification.HasBeenNotified());
}

TEST(NotificationTest, WakesEveryWaiterAndPublishesWhatTheNotifierWrote) {
  Notification notification;
  int written = 0;  // Plain int: TSan checks that Notify orders the write before the reads.
  std::vector<int> seen(4, -1);
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&, i] {
      if (i % 2 == 0) {
        notification.WaitForNotification();
      } else {
        ASSERT_TRUE(notification.WaitForNotificationWithTimeout(absl::InfiniteDuration()));
      }
      seen[i] = written;
    });
  }
  written = 42;
  notification.Notify();
  for (std::thread& waiter : waiters) waiter.join();
  EXPECT_EQ(seen, std::vector<int>(4, 42));
}

TEST(NotificationTest, TheWaiterMayDestroyItAsSoonAsTheWaitReturns) {
  // The pattern of a synchronous call over an asynchronous one: the notifier must not touch the
  // Notification after the waiter has been released (ASan and TSan check this).
  for (int round = 0; round < 200; ++round) {
    auto notification = std::make_unique<Notification>();
    std::thread notifier([raw = notification.get()] { raw->Notify(); });
    notification->WaitForNotification();
    notification.reset();
    notifier.join();
  }
}

}  // namespace
}  // namespace attnserve
