// How the decoding loop forms iterations from arriving steps:
// - AppendAll: steps queued together run in one iteration (the loop is not paused: it is the
//   single lock and wake-up that keep them together), each is answered exactly as alone, and a
//   bad one is refused by itself, in order, while the others run;
// - gather_delay_us (fake clock): with fewer steps waiting than the last two iterations answered
//   sessions, the loop waits for the rest, up to the delay, and forms the iteration as soon as
//   they are all there; so a round once split in two re-forms whole.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/batching/fake_clock.h"
#include "server/decoding/decode_runtime.h"
#include "tests/core/attention_test_support.h"
#include "tests/core/kv_cache/kv_test_support.h"
#include "tests/server/decoding/decode_test_support.h"

namespace attnserve::testing {
namespace {

using decoding::DecodeRuntime;
using decoding::SessionId;
using decoding::StepRequest;
using ::testing::HasSubstr;

constexpr int64_t kSessions = 8;

TEST(IterationFormingTest, StepsQueuedTogetherShareOneIterationAndFailAlone) {
  const TestModel m = MakeModel("m", 1, 11);
  RecordingListener listener;
  auto rt = DecodeRuntime::Create({.idle_timeout_us = 0, .compute_threads = 1},
                                  batching::RealClock::Default(), &listener);
  ASSERT_TRUE(rt.ok()) << rt.status();
  std::vector<SessionId> ids;
  for (int64_t i = 0; i < kSessions; ++i) ids.push_back(OpenReady(**rt, m.model));
  const size_t iterations_before = listener.iterations().size();

  std::vector<std::vector<float>> rows;
  std::vector<Answer> answers(kSessions);
  std::vector<StepRequest> steps;
  for (int64_t i = 0; i < kSessions; ++i) {
    rows.push_back(UniformValues(kD, 100 + i));
    steps.push_back({.session = ids[i], .rows = rows[i], .done = answers[i].Callback()});
  }
  Answer unused;
  steps.push_back({.session = 999, .rows = UniformValues(kD, 1), .done = unused.Callback()});
  steps.push_back({.session = ids[0], .rows = UniformValues(kD + 1, 2), .done = unused.Callback()});
  std::vector<StepRequest*> requests;
  for (StepRequest& step : steps) requests.push_back(&step);

  const std::vector<absl::Status> statuses = (*rt)->AppendAll(requests);
  ASSERT_EQ(statuses.size(), steps.size());
  for (int64_t i = 0; i < kSessions; ++i) EXPECT_TRUE(statuses[i].ok()) << statuses[i];
  EXPECT_EQ(statuses[kSessions].code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(statuses[kSessions].message()), HasSubstr("no open session 999"));
  EXPECT_EQ(statuses[kSessions + 1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(statuses[kSessions + 1].message()),
              HasSubstr("rows: expected a multiple of d_model (32) floats, got 33"));
  EXPECT_NE(steps[kSessions].done, nullptr) << "a refused step's callback stays the caller's";

  for (int64_t i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(answers[i].Get().ok()) << answers[i].Get().status();
    EXPECT_LE(MaxAbsDiff(*answers[i].Get(), FullForward(*m.model->layer, rows[i], true)), kExact);
  }
  EXPECT_FALSE(unused.notified.HasBeenNotified());
  const std::vector<decoding::IterationReport> iterations = listener.iterations();
  ASSERT_EQ(iterations.size(), iterations_before + 1) << "the steps were split over iterations";
  EXPECT_EQ(iterations.back().decode_tokens, kSessions);
}

// Appends one one-row step (values from `seed`) to each of `ids` with one AppendAll.
void StepEach(DecodeRuntime& rt, const std::vector<SessionId>& ids, std::vector<Answer>& answers,
              uint64_t seed) {
  std::vector<StepRequest> steps;
  for (size_t i = 0; i < ids.size(); ++i) {
    steps.push_back(
        {.session = ids[i], .rows = UniformValues(kD, seed + i), .done = answers[i].Callback()});
  }
  std::vector<StepRequest*> requests;
  for (StepRequest& step : steps) requests.push_back(&step);
  for (const absl::Status& s : rt.AppendAll(requests)) EXPECT_TRUE(s.ok()) << s;
}

TEST(IterationFormingTest, GatherDelayWaitsForTheLastIterationsSessionsUpToTheDelay) {
  constexpr int64_t kStart = 1000, kDelay = 500;
  const TestModel m = MakeModel("m", 1, 12);
  batching::FakeClock clock(kStart);
  RecordingListener listener;
  auto rt = DecodeRuntime::Create(
      {.idle_timeout_us = 0, .gather_delay_us = kDelay, .compute_threads = 1}, &clock, &listener);
  ASSERT_TRUE(rt.ok()) << rt.status();
  const std::vector<SessionId> ids{OpenReady(**rt, m.model), OpenReady(**rt, m.model),
                                   OpenReady(**rt, m.model)};
  std::vector<Answer> first(3);
  StepEach(**rt, ids, first, 10);  // All three at once: no wait.
  for (Answer& a : first) ASSERT_TRUE(a.Get().ok()) << a.Get().status();
  ASSERT_EQ(listener.iterations().back().decode_tokens, 3);

  // Two of the three: the loop waits until kStart + kDelay; the third completes the iteration
  // at once, the clock unmoved.
  std::vector<Answer> second(3);
  StepEach(**rt, {ids[0], ids[1]}, second, 20);
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(kStart + kDelay, kWait));
  EXPECT_FALSE(second[0].notified.HasBeenNotified()) << "formed without waiting";
  std::vector<Answer> third_alone(1);
  StepEach(**rt, {ids[2]}, third_alone, 22);
  ASSERT_TRUE(second[0].Get().ok() && second[1].Get().ok() && third_alone[0].Get().ok());
  EXPECT_EQ(listener.iterations().back().decode_tokens, 3);
  EXPECT_EQ(clock.NowMicros(), kStart);

  // Two of three again, and the third never comes: the iteration runs at the deadline with two.
  std::vector<Answer> fourth(2);
  StepEach(**rt, {ids[0], ids[1]}, fourth, 30);
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(kStart + kDelay, kWait));
  clock.AdvanceMicros(kDelay - 1);
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(kStart + kDelay, kWait));
  EXPECT_FALSE(fourth[0].notified.HasBeenNotified()) << "formed before the deadline";
  clock.AdvanceMicros(1);
  ASSERT_TRUE(fourth[0].Get().ok() && fourth[1].Get().ok());
  EXPECT_EQ(listener.iterations().back().decode_tokens, 2);
}

TEST(IterationFormingTest, GatherDelayWaitsForTheSessionsOfTheLastTwoIterations) {
  constexpr int64_t kStart = 1000, kDelay = 500;
  const TestModel m = MakeModel("m", 1, 13);
  batching::FakeClock clock(kStart);
  RecordingListener listener;
  auto rt = DecodeRuntime::Create(
      {.idle_timeout_us = 0, .gather_delay_us = kDelay, .compute_threads = 1}, &clock, &listener);
  ASSERT_TRUE(rt.ok()) << rt.status();
  const std::vector<SessionId> ids{OpenReady(**rt, m.model), OpenReady(**rt, m.model),
                                   OpenReady(**rt, m.model)};
  std::vector<Answer> whole(3);
  StepEach(**rt, ids, whole, 10);
  for (Answer& a : whole) ASSERT_TRUE(a.Get().ok()) << a.Get().status();

  // A round split in two: sessions 0 and 1 at the deadline, then session 2 at the next one.
  std::vector<Answer> first_part(2), second_part(1);
  StepEach(**rt, {ids[0], ids[1]}, first_part, 20);
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(kStart + kDelay, kWait));
  clock.AdvanceMicros(kDelay);
  ASSERT_TRUE(first_part[0].Get().ok() && first_part[1].Get().ok());
  StepEach(**rt, {ids[2]}, second_part, 22);
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(kStart + 2 * kDelay, kWait));
  clock.AdvanceMicros(kDelay);
  ASSERT_TRUE(second_part[0].Get().ok());
  ASSERT_EQ(listener.iterations().back().decode_tokens, 1);

  // The last iteration ran one step, but the last two answered all three sessions: one step
  // waiting is not enough, and the round forms whole again as soon as the others arrive.
  std::vector<Answer> next(3);
  StepEach(**rt, {ids[0]}, next, 30);
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(kStart + 3 * kDelay, kWait));
  EXPECT_FALSE(next[0].notified.HasBeenNotified()) << "formed with one of three";
  std::vector<Answer> rest(2);
  StepEach(**rt, {ids[1], ids[2]}, rest, 31);
  ASSERT_TRUE(next[0].Get().ok() && rest[0].Get().ok() && rest[1].Get().ok());
  EXPECT_EQ(listener.iterations().back().decode_tokens, 3);
  EXPECT_EQ(clock.NowMicros(), kStart + 2 * kDelay);
}

TEST(IterationFormingTest, NegativeGatherDelayIsRefusedNamingTheField) {
  const absl::Status s = decoding::ValidateDecodeRuntimeOptions({.gather_delay_us = -1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gather_delay_us: expected >= 0"));
}

}  // namespace
}  // namespace attnserve::testing
