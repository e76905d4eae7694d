// The decoding loop's passes take their threads from ComputeTeams (the server's compute budget,
// shared with the Attend batches): an observable fake shows that every forward pass and memory
// load acquires a team before computing and releases it after, that a pass waits while the
// budget has no thread free, and that the outputs are those of a runtime with its own threads.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "server/decoding/decode_runtime.h"
#include "tests/core/attention_test_support.h"
#include "tests/server/decoding/decode_test_support.h"

namespace attnserve::testing {
namespace {

using decoding::DecodeRuntime;
using decoding::SessionId;

// Grants one thread per Acquire while open; while closed, Acquire blocks (a busy budget).
class FakeTeams : public decoding::ComputeTeams {
 public:
  int Acquire(int wanted) override {
    std::unique_lock<std::mutex> lock(mu_);
    wanted_.push_back(wanted);
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
    ++acquired_;
    ++held_;
    return 1;
  }
  void Release(int granted) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(granted, 1);
    ++released_;
    --held_;
  }
  void SetOpen(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    changed_.notify_all();
  }
  // Waits (bounded) until Acquire was called n times in all.
  bool WaitForAsks(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(60), [&] { return wanted_.size() >= n; });
  }
  int acquired() {
    std::lock_guard<std::mutex> lock(mu_);
    return acquired_;
  }
  int released() {
    std::lock_guard<std::mutex> lock(mu_);
    return released_;
  }
  int held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  std::vector<int> wanted() {
    std::lock_guard<std::mutex> lock(mu_);
    return wanted_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = true;
  std::vector<int> wanted_;
  int acquired_ = 0, released_ = 0, held_ = 0;
};

TEST(DecodeComputeTeamsTest, EveryPassAcquiresATeamAndReleasesItBeforeTheAnswer) {
  const TestModel m = MakeModel("m", 1, 11);
  FakeTeams teams;
  RecordingListener listener;
  auto rt = DecodeRuntime::Create({.idle_timeout_us = 0, .compute_threads = 3},
                                  batching::RealClock::Default(), &listener, &teams);
  ASSERT_TRUE(rt.ok()) << rt.status();
  const SessionId self_a = OpenReady(**rt, m.model);
  const SessionId self_b = OpenReady(**rt, m.model);
  EXPECT_EQ(teams.acquired(), 0) << "a self-attention open computes nothing";
  const SessionId cross = OpenReady(**rt, m.model, 0, UniformValues(5 * kD, 1));
  EXPECT_EQ(teams.acquired(), 1) << "loading the memory is a pass";
  EXPECT_EQ(teams.released(), 1);

  // Three sessions' steps in one iteration: one self pass (both self sessions), one cross pass.
  (*rt)->Pause();
  Answer a, b, c;
  ASSERT_TRUE(Append(**rt, self_a, UniformValues(4 * kD, 2), &a).ok());
  ASSERT_TRUE(Append(**rt, self_b, UniformValues(kD, 3), &b).ok());
  ASSERT_TRUE(Append(**rt, cross, UniformValues(kD, 4), &c).ok());
  (*rt)->Resume();
  for (Answer* answer : {&a, &b, &c}) ASSERT_TRUE(answer->Get().ok()) << answer->Get().status();
  int64_t forwards = 0;
  for (const decoding::IterationReport& report : listener.iterations()) forwards += report.forwards;
  EXPECT_EQ(forwards, 2);
  EXPECT_EQ(teams.acquired(), 1 + forwards);
  EXPECT_EQ(teams.released(), teams.acquired());
  EXPECT_EQ(teams.held(), 0);
  for (int wanted : teams.wanted()) EXPECT_EQ(wanted, 3) << "asks for options.compute_threads";
}

TEST(DecodeComputeTeamsTest, APassWaitsForAFreeThreadAndComputesTheSameOutput) {
  const TestModel m = MakeModel("m", 1, 12);
  const std::vector<float> prompt = UniformValues(9 * kD, 5);
  // The same prompt through a runtime with its own threads: what the shared one must answer.
  std::vector<float> expected;
  {
    auto own = DecodeRuntime::Create({.idle_timeout_us = 0, .compute_threads = 1});
    ASSERT_TRUE(own.ok());
    Answer answer;
    ASSERT_TRUE(Append(**own, OpenReady(**own, m.model), prompt, &answer).ok());
    ASSERT_TRUE(answer.Get().ok());
    expected = *answer.Get();
  }
  FakeTeams teams;
  auto rt = DecodeRuntime::Create({.idle_timeout_us = 0}, batching::RealClock::Default(), nullptr,
                                  &teams);
  ASSERT_TRUE(rt.ok());
  const SessionId id = OpenReady(**rt, m.model);
  teams.SetOpen(false);  // Every thread of the budget is busy elsewhere (e.g. an Attend batch).
  Answer answer;
  ASSERT_TRUE(Append(**rt, id, prompt, &answer).ok());
  ASSERT_TRUE(teams.WaitForAsks(1));
  EXPECT_FALSE(answer.notified.HasBeenNotified()) << "computed without a team";
  EXPECT_EQ(teams.acquired(), 0);
  teams.SetOpen(true);
  ASSERT_TRUE(answer.Get().ok()) << answer.Get().status();
  EXPECT_EQ(*answer.Get(), expected);
  EXPECT_EQ(teams.wanted().front(), std::numeric_limits<int>::max())
      << "compute_threads 0: as many as the budget has";
  EXPECT_EQ(teams.released(), 1);
}

}  // namespace
}  // namespace attnserve::testing
