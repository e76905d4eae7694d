#include "server/service/open_calls.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

using std::chrono::steady_clock;

TEST(OpenCallsTest, CountsCallsUntilEachIsDone) {
  OpenCalls calls;
  EXPECT_TRUE(calls.WaitUntilNone(steady_clock::now()));
  calls.Add();
  calls.Add();
  EXPECT_EQ(calls.count(), 2);
  EXPECT_FALSE(calls.WaitUntilNone(steady_clock::now()));  // Deadline passed: does not wait.
  calls.Done();
  EXPECT_FALSE(calls.WaitUntilNone(steady_clock::now()));
  calls.Done();
  EXPECT_EQ(calls.count(), 0);
  EXPECT_TRUE(calls.WaitUntilNone(steady_clock::now()));
}

TEST(OpenCallsTest, AWaiterWakesWhenTheLastCallIsDone) {
  OpenCalls calls;
  calls.Add();
  bool none = false;
  std::thread waiter(
      [&] { none = calls.WaitUntilNone(steady_clock::now() + std::chrono::hours(1)); });
  calls.Done();  // Before or after the waiter sleeps: either way it must return true.
  waiter.join();
  EXPECT_TRUE(none);
}

}  // namespace
}  // namespace attnserve::server
