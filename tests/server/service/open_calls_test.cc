#include "server/service/open_calls.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

using std::chrono::steady_clock;

TEST(OpenCallsTest, CountsCallsUntilEachIsDone) {
  OpenCalls calls;
  EXPECT_TRUE(calls.WaitUntilOnlyHeld(steady_clock::now()));
  calls.Add();
  calls.Add();
  EXPECT_EQ(calls.count(), 2);
  EXPECT_FALSE(calls.WaitUntilOnlyHeld(steady_clock::now()));  // Deadline passed: no wait.
  calls.Done();
  EXPECT_FALSE(calls.WaitUntilOnlyHeld(steady_clock::now()));
  calls.Done();
  EXPECT_EQ(calls.count(), 0);
  EXPECT_TRUE(calls.WaitUntilOnlyHeld(steady_clock::now()));
}

TEST(OpenCallsTest, HeldRefusalsAreNotWaitedFor) {
  OpenCalls calls;
  calls.Add();
  calls.Add();
  calls.MarkHeld();
  EXPECT_EQ(calls.held(), 1);
  EXPECT_FALSE(calls.WaitUntilOnlyHeld(steady_clock::now()));  // One is still work.
  calls.MarkHeld();
  EXPECT_TRUE(calls.WaitUntilOnlyHeld(steady_clock::now()));
  calls.UnmarkHeld();
  calls.Done();
  calls.UnmarkHeld();
  calls.Done();
  EXPECT_EQ(calls.count(), 0);
  EXPECT_EQ(calls.held(), 0);
}

TEST(OpenCallsTest, AWaiterWakesWhenTheLastCallIsDone) {
  OpenCalls calls;
  calls.Add();
  bool none = false;
  std::thread waiter(
      [&] { none = calls.WaitUntilOnlyHeld(steady_clock::now() + std::chrono::hours(1)); });
  calls.Done();  // Before or after the waiter sleeps: either way it must return true.
  waiter.join();
  EXPECT_TRUE(none);
}

// The last open call turning into a held refusal ends the wait as its end would.
TEST(OpenCallsTest, AWaiterWakesWhenTheLastCallIsHeld) {
  OpenCalls calls;
  calls.Add();
  bool only_held = false;
  std::thread waiter(
      [&] { only_held = calls.WaitUntilOnlyHeld(steady_clock::now() + std::chrono::hours(1)); });
  calls.MarkHeld();
  waiter.join();
  EXPECT_TRUE(only_held);
  calls.UnmarkHeld();
  calls.Done();
}

}  // namespace
}  // namespace attnserve::server
