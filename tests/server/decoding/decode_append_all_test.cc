// DecodeRuntime::AppendAll: steps queued together run in one iteration (the loop is not paused:
// it is the single lock and wake-up that keep them together), each is answered exactly as alone,
// and a bad one is refused by itself, in order, while the others run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

TEST(DecodeAppendAllTest, StepsQueuedTogetherShareOneIterationAndFailAlone) {
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

}  // namespace
}  // namespace attnserve::testing
