// Session lives in the decoding runtime: idle timeout (fake clock), close by client and by owner,
// drain, and a reload during sessions — each ends with every block freed (cache used back to
// exactly 0), and a session keeps computing with the model version it started with.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "server/batching/fake_clock.h"
#include "server/decoding/decode_runtime.h"
#include "tests/core/attention_test_support.h"
#include "tests/core/kv_cache/kv_test_support.h"
#include "tests/server/decoding/decode_test_support.h"

namespace attnserve::testing {
namespace {

using decoding::CloseReason;
using decoding::DecodeRuntime;
using decoding::SessionId;

std::unique_ptr<DecodeRuntime> MakeRuntime(batching::Clock* clock, RecordingListener* listener,
                                           int64_t idle_timeout_us = 0) {
  auto runtime = DecodeRuntime::Create({.idle_timeout_us = idle_timeout_us, .compute_threads = 1},
                                       clock, listener);
  EXPECT_TRUE(runtime.ok()) << runtime.status();
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

// Runs a prompt of `rows` rows through session `id` and expects success.
void Prefill(DecodeRuntime& rt, SessionId id, int64_t rows, uint64_t seed) {
  Answer answer;
  ASSERT_TRUE(Append(rt, id, UniformValues(rows * kD, seed), &answer).ok());
  ASSERT_TRUE(answer.Get().ok()) << answer.Get().status();
}

TEST(DecodeSessionsTest, IdleSessionIsClosedByTheClockAndFreesItsBlocks) {
  const TestModel m = MakeModel("m", 1, 3);
  batching::FakeClock clock(1000);
  RecordingListener listener;
  auto rt = MakeRuntime(&clock, &listener, /*idle_timeout_us=*/5000);
  ASSERT_NE(rt, nullptr);
  const SessionId idle = OpenReady(*rt, m.model);
  const SessionId busy = OpenReady(*rt, m.model, 0, UniformValues(7 * kD, 4));  // Cross.
  Prefill(*rt, idle, 20, 1);
  EXPECT_GT(rt->Stats().kv_bytes_used, 0);
  // The loop has seen both sessions go quiet at 1000 and waits for 1000 + 5000.
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(6000, kWait));
  clock.AdvanceMicros(4999);
  Prefill(*rt, busy, 2, 2);  // Keeps `busy` active: its deadline moves to 5999 + 5000.
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(6000, kWait));
  EXPECT_EQ(rt->Stats().sessions_open, 2) << "closed before its idle timeout";
  clock.AdvanceMicros(1);
  ASSERT_TRUE(listener.WaitForClosed(1));
  EXPECT_EQ(listener.closed()[0], std::make_pair(idle, CloseReason::kIdle));
  Answer late;
  EXPECT_EQ(Append(*rt, idle, UniformValues(kD, 5), &late).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rt->Stats().sessions_open, 1);
  clock.AdvanceMicros(5000);
  ASSERT_TRUE(listener.WaitForClosed(2));
  const decoding::DecodeStats stats = rt->Stats();
  EXPECT_EQ(stats.kv_bytes_used, 0);
  EXPECT_EQ(stats.sessions_open, 0);
  EXPECT_EQ(stats.sessions_closed[static_cast<int>(CloseReason::kIdle)], 2);
}

TEST(DecodeSessionsTest, CloseOwnerEndsEverySessionItHeldAndCancelsTheirQueuedSteps) {
  const TestModel m = MakeModel("m", 1, 3);
  RecordingListener listener;
  auto rt = MakeRuntime(batching::RealClock::Default(), &listener);
  ASSERT_NE(rt, nullptr);
  std::vector<SessionId> gone;
  for (int i = 0; i < 3; ++i) {
    gone.push_back(OpenReady(*rt, m.model, /*owner=*/7));
    Prefill(*rt, gone.back(), 10 + i, i);
  }
  const SessionId kept = OpenReady(*rt, m.model, /*owner=*/8);
  Prefill(*rt, kept, 9, 9);
  const int64_t used_before = rt->Stats().kv_bytes_used;
  EXPECT_GT(used_before, 0);

  rt->Pause();
  Answer queued;
  ASSERT_TRUE(Append(*rt, gone[0], UniformValues(kD, 11), &queued).ok());
  EXPECT_EQ(rt->CloseOwner(7), 3);
  EXPECT_EQ(rt->CloseOwner(7), 0);
  rt->Resume();
  EXPECT_EQ(queued.Get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_NE(queued.Get().status().message().find("owner_gone"), std::string::npos)
      << queued.Get().status();
  ASSERT_TRUE(listener.WaitForClosed(3));
  for (const auto& [id, reason] : listener.closed()) EXPECT_EQ(reason, CloseReason::kOwnerGone);

  // The other owner's session goes on, and holds less cache than before.
  Prefill(*rt, kept, 1, 12);
  const decoding::DecodeStats stats = rt->Stats();
  EXPECT_LT(stats.kv_bytes_used, used_before);
  EXPECT_GT(stats.kv_bytes_used, 0);
  EXPECT_EQ(stats.sessions_open, 1);
  EXPECT_EQ(stats.sessions_closed[static_cast<int>(CloseReason::kOwnerGone)], 3);

  ASSERT_TRUE(rt->Close(kept).ok());
  EXPECT_EQ(rt->Close(kept).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(listener.WaitForClosed(4));
  EXPECT_EQ(rt->Stats().kv_bytes_used, 0);
  EXPECT_EQ(rt->Stats().sessions_closed[static_cast<int>(CloseReason::kClient)], 1);
}

TEST(DecodeSessionsTest, DrainAnswersAcceptedStepsThenEndsSessionsAndFreesEverything) {
  const TestModel m = MakeModel("m", 1, 3);
  RecordingListener listener;
  auto rt = MakeRuntime(batching::RealClock::Default(), &listener);
  ASSERT_NE(rt, nullptr);
  const SessionId a = OpenReady(*rt, m.model);
  const SessionId b = OpenReady(*rt, m.model, 0, UniformValues(5 * kD, 1));
  Prefill(*rt, a, 30, 2);
  rt->Pause();
  std::vector<Answer> answers(3);
  ASSERT_TRUE(Append(*rt, a, UniformValues(kD, 3), &answers[0]).ok());
  ASSERT_TRUE(Append(*rt, a, UniformValues(kD, 4), &answers[1]).ok());
  ASSERT_TRUE(Append(*rt, b, UniformValues(3 * kD, 5), &answers[2]).ok());
  rt->Drain();  // Overrides the pause.
  for (Answer& answer : answers) EXPECT_TRUE(answer.Get().ok()) << answer.Get().status();
  ASSERT_TRUE(listener.WaitForClosed(2));
  for (const auto& [id, reason] : listener.closed()) EXPECT_EQ(reason, CloseReason::kDrained);
  const decoding::DecodeStats stats = rt->Stats();
  EXPECT_EQ(stats.kv_bytes_used, 0);
  EXPECT_EQ(stats.sessions_open, 0);
  EXPECT_EQ(stats.steps_queued, 0);
  EXPECT_EQ(stats.sessions_closed[static_cast<int>(CloseReason::kDrained)], 2);
  const auto reopened = rt->Open({.model = m.model}, nullptr);
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kUnavailable);
  Answer after;
  EXPECT_EQ(Append(*rt, a, UniformValues(kD, 6), &after).code(), absl::StatusCode::kUnavailable);
  rt->Drain();  // Idempotent.
}

// A session opened on version 1 keeps computing with version 1 after the name serves version 2
// (the test drops its own reference, as the router does on reload); version 1 is freed with its
// last session.
TEST(DecodeSessionsTest, SessionKeepsItsModelVersionAcrossAReload) {
  TestModel v1 = MakeModel("m", 1, 21);
  const TestModel v2 = MakeModel("m", 2, 22);
  const std::shared_ptr<const core::AttentionLayer> v1_layer = v1.model->layer;
  RecordingListener listener;
  auto rt = MakeRuntime(batching::RealClock::Default(), &listener);
  ASSERT_NE(rt, nullptr);
  const SessionId old_session = OpenReady(*rt, v1.model);
  const std::weak_ptr<const model::Model> v1_alive = v1.model;
  v1.model.reset();  // "Reloaded": only the session holds version 1 now.
  const SessionId new_session = OpenReady(*rt, v2.model);
  EXPECT_EQ(rt->SessionsPerVersion(),
            (std::map<std::pair<std::string, int64_t>, int64_t>{{{"m", 1}, 1}, {{"m", 2}, 1}}));

  constexpr int64_t kRows = 12;
  const std::vector<float> x = UniformValues(kRows * kD, 30);
  std::vector<float> old_out, new_out;
  for (int64_t r = 0; r < kRows; r += (r == 0 ? 8 : 1)) {
    const int64_t n = r == 0 ? 8 : 1;
    Answer a, b;
    rt->Pause();
    ASSERT_TRUE(Append(*rt, old_session, Rows(x, r, n), &a).ok());
    ASSERT_TRUE(Append(*rt, new_session, Rows(x, r, n), &b).ok());
    rt->Resume();
    ASSERT_TRUE(a.Get().ok()) << a.Get().status();
    ASSERT_TRUE(b.Get().ok()) << b.Get().status();
    old_out.insert(old_out.end(), a.Get()->begin(), a.Get()->end());
    new_out.insert(new_out.end(), b.Get()->begin(), b.Get()->end());
  }
  EXPECT_LE(MaxAbsDiff(old_out, FullForward(*v1_layer, x, true)), kExact);
  EXPECT_LE(MaxAbsDiff(new_out, FullForward(*v2.model->layer, x, true)), kExact);
  EXPECT_GT(MaxAbsDiff(old_out, new_out), 1e-3) << "both sessions ran the same version";
  // A step that names the version it expects is checked against the session's.
  decoding::StepRequest wrong{.session = old_session,
                              .rows = Rows(x, 0, 1),
                              .model = "m",
                              .model_version = 2,
                              .done = [](absl::StatusOr<std::vector<float>>) {}};
  const absl::Status mismatch = rt->Append(&wrong);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.message().find("model_version: session " + std::to_string(old_session) +
                                    " runs on version 1, got 2"),
            std::string::npos)
      << mismatch;

  EXPECT_FALSE(v1_alive.expired());
  ASSERT_TRUE(rt->Close(old_session).ok());
  ASSERT_TRUE(listener.WaitForClosed(1));
  EXPECT_TRUE(v1_alive.expired()) << "version 1 outlived its last session";
  EXPECT_EQ(rt->SessionsPerVersion(),
            (std::map<std::pair<std::string, int64_t>, int64_t>{{{"m", 2}, 1}}));
}

// A client closes a session whose long prompt is half computed (some chunks cached, the rest
// queued): the prompt is answered CANCELLED once, its blocks come back, the others go on.
TEST(DecodeSessionsTest, ClosingDuringAChunkedPromptCancelsItAndFreesItsBlocks) {
  const TestModel m = MakeModel("m", 1, 3);
  RecordingListener listener;
  auto runtime =
      DecodeRuntime::Create({.scheduling = {.max_iteration_tokens = 17, .prefill_chunk_tokens = 16},
                             .idle_timeout_us = 0,
                             .compute_threads = 1},
                            batching::RealClock::Default(), &listener);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  DecodeRuntime& rt = **runtime;
  const SessionId prompt_session = OpenReady(rt, m.model);
  const SessionId decoder = OpenReady(rt, m.model);
  Answer prompt, first_step, second_step;
  absl::Status close_status = absl::UnknownError("not called");
  rt.Pause();
  ASSERT_TRUE(Append(rt, prompt_session, UniformValues(160 * kD, 1), &prompt).ok());
  // The decoder's first answer comes with the prompt's first chunk; it closes the prompt's
  // session from there (callbacks may call the runtime), and steps on.
  decoding::StepRequest step{.session = decoder,
                             .rows = UniformValues(kD, 2),
                             .done = [&](absl::StatusOr<std::vector<float>> r) {
                               close_status = rt.Close(prompt_session);
                               first_step.Callback()(std::move(r));
                             }};
  ASSERT_TRUE(rt.Append(&step).ok());
  rt.Resume();
  ASSERT_TRUE(first_step.Get().ok()) << first_step.Get().status();
  EXPECT_TRUE(close_status.ok()) << close_status;
  EXPECT_EQ(prompt.Get().status().code(), absl::StatusCode::kCancelled) << prompt.Get().status();
  ASSERT_TRUE(listener.WaitForClosed(1));
  ASSERT_TRUE(Append(rt, decoder, UniformValues(kD, 3), &second_step).ok());
  ASSERT_TRUE(second_step.Get().ok()) << second_step.Get().status();
  EXPECT_EQ(rt.Stats().kv_bytes_used, 16 * 2 * kD * 4) << "only the decoder's block is in use";
  ASSERT_TRUE(rt.Close(decoder).ok());
  ASSERT_TRUE(listener.WaitForClosed(2));
  EXPECT_EQ(rt.Stats().kv_bytes_used, 0);
}

}  // namespace
}  // namespace attnserve::testing
