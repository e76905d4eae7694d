// attnserve::client's decoding sessions (DecodeStream, DecodeSession) against a real in-process
// server on 127.0.0.1: outputs equal the core's full causal (or cross-attention) forward of the
// whole sequence, many sessions per message, the async paths, per-item errors while the other
// sessions go on, and closing the stream freeing the server's cache.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/client/client.h"
#include "attnserve/client/decode.h"
#include "core/util/notification.h"
#include "server/decoding/decode_runtime.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;
namespace ac = ::attnserve::client;

constexpr int64_t kD = kSmallWidth;

std::vector<float> Slice(const std::vector<float>& values, int64_t from, int64_t rows) {
  return {values.begin() + from * kD, values.begin() + (from + rows) * kD};
}

ac::TensorView RowsOf(const std::vector<float>& values) {
  return {values, {static_cast<int64_t>(values.size()) / kD, kD}};
}

class DecodeClientTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer();
    absl::StatusOr<std::unique_ptr<ac::Client>> created =
        ac::Client::Create(absl::StrCat("127.0.0.1:", server().port()));
    ASSERT_TRUE(created.ok()) << created.status();
    client_ = *std::move(created);
  }

  std::unique_ptr<ac::DecodeStream> OpenStream(ac::DecodeStreamOptions options = {}) {
    absl::StatusOr<std::unique_ptr<ac::DecodeStream>> stream = client_->OpenDecodeStream(options);
    EXPECT_TRUE(stream.ok()) << stream.status();
    return stream.ok() ? *std::move(stream) : nullptr;
  }

  // The core's causal self-attention output of `all` rows, or cross-attention over `memory`.
  std::vector<float> Core(const std::vector<float>& all, const std::vector<float>& memory = {}) {
    return CoreCompute(*Layer(kSmallModel),
                       {.query = all, .memory = memory, .causal = memory.empty()})
        .output;
  }

  // Waits (bounded) until the server holds no session and no cache.
  ::testing::AssertionResult ServerFreed() {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    decoding::DecodeStats stats = server().decode_runtime().Stats();
    while (stats.sessions_open != 0 || stats.kv_bytes_used != 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        return ::testing::AssertionFailure() << stats.sessions_open << " sessions, "
                                             << stats.kv_bytes_used << " bytes still held";
      }
      std::this_thread::yield();
      stats = server().decode_runtime().Stats();
    }
    return ::testing::AssertionSuccess();
  }

  std::unique_ptr<ac::Client> client_;
};

TEST_F(DecodeClientTest, ManySessionsInOneMessageEqualTheCoresFullForward) {
  std::unique_ptr<ac::DecodeStream> stream = OpenStream();
  ASSERT_NE(stream, nullptr);
  const int64_t prompt = 5, steps = 4;
  const std::vector<float> a = TestValues((prompt + steps) * kD, 1);
  const std::vector<float> b = TestValues((prompt + steps) * kD, 2);
  const std::vector<float> memory = TestValues(7 * kD, 3);

  ac::DecodeMessage first;
  first.opens = {{.session = "a", .model = kSmallModel},
                 {.session = "b", .model = kSmallModel},
                 {.session = "x", .model = kSmallModel, .memory = RowsOf(memory)}};
  const std::vector<float> a_prompt = Slice(a, 0, prompt), b_prompt = Slice(b, 0, prompt);
  first.steps = {{.session = "a", .rows = RowsOf(a_prompt)},
                 {.session = "b", .rows = RowsOf(b_prompt)},
                 {.session = "x", .rows = RowsOf(a_prompt)}};
  absl::StatusOr<ac::DecodeAnswer> answer = stream->Send(first);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->opens.size(), 3u);
  for (const auto& opened : answer->opens) {
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(opened->model, kSmallModel);
    EXPECT_EQ(opened->model_version, 1);
  }
  EXPECT_EQ(answer->opens[2]->session, "x");
  ASSERT_EQ(answer->steps.size(), 3u);
  std::vector<std::vector<float>> outputs(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(answer->steps[i].ok()) << answer->steps[i].status();
    EXPECT_EQ(answer->steps[i]->shape, (std::vector<int64_t>{prompt, kD}));
    outputs[i] = answer->steps[i]->data;
  }
  EXPECT_GT(answer->latency.count(), 0);
  EXPECT_GT(answer->request_bytes, 3 * prompt * kD * 4);
  EXPECT_GT(answer->response_bytes, 3 * prompt * kD * 4);

  for (int64_t t = prompt; t < prompt + steps; ++t) {
    const std::vector<float> a_row = Slice(a, t, 1), b_row = Slice(b, t, 1);
    ac::DecodeMessage step;  // One message, one row for each of the three sessions.
    step.steps = {{.session = "a", .rows = RowsOf(a_row)},
                  {.session = "b", .rows = RowsOf(b_row)},
                  {.session = "x", .rows = RowsOf(a_row)}};
    answer = stream->Send(step);
    ASSERT_TRUE(answer.ok()) << answer.status();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(answer->steps[i].ok()) << answer->steps[i].status();
      EXPECT_EQ(answer->steps[i]->shape, (std::vector<int64_t>{1, kD}));
      outputs[i].insert(outputs[i].end(), answer->steps[i]->data.begin(),
                        answer->steps[i]->data.end());
    }
  }
  EXPECT_TRUE(Near(outputs[0], Core(a)));
  EXPECT_TRUE(Near(outputs[1], Core(b)));
  EXPECT_TRUE(Near(outputs[2], Core(a, memory)));
  EXPECT_TRUE(stream->Close().ok());
  EXPECT_TRUE(ServerFreed());
}

TEST_F(DecodeClientTest, SixteenBitAndValuesWireGiveTheSameSession) {
  const std::vector<float> rows = TestValues(6 * kD, 4);
  for (bool raw : {true, false}) {
    std::unique_ptr<ac::DecodeStream> stream = OpenStream({.raw = raw});
    ASSERT_NE(stream, nullptr);
    ASSERT_TRUE(stream->Open({.session = "s", .model = kSmallModel}).ok());
    absl::StatusOr<ac::Tensor> out = stream->Step("s", RowsOf(rows));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(Near(out->data, Core(rows)));
  }
  std::unique_ptr<ac::DecodeStream> bf16 = OpenStream(
      {.wire_dtype = ac::WireDtype::kBFloat16, .answer_wire_dtype = ac::WireDtype::kBFloat16});
  ASSERT_TRUE(bf16->Open({.session = "s", .model = kSmallModel}).ok());
  absl::StatusOr<ac::Tensor> out = bf16->Step("s", RowsOf(rows));
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> expected = Core(rows);
  ASSERT_EQ(out->data.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(out->data[i], expected[i], 0.05) << i;
  // 16-bit types need raw: refused before sending.
  std::unique_ptr<ac::DecodeStream> bad =
      OpenStream({.raw = false, .wire_dtype = ac::WireDtype::kFloat16});
  EXPECT_EQ(bad->Step("s", RowsOf(rows)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DecodeClientTest, AsyncCallbacksAndFuturesAnswerEveryMessage) {
  std::unique_ptr<ac::DecodeStream> stream = OpenStream({.max_in_flight = 2});
  ASSERT_NE(stream, nullptr);
  const int64_t rows = 8;
  const std::vector<float> all = TestValues(rows * kD, 5);
  ASSERT_TRUE(stream->Open({.session = "s", .model = kSmallModel}).ok());
  // Eight one-row steps in flight at once (max_in_flight 2 makes the sender wait): the server
  // applies them in order, so the session's rows are the whole sequence.
  std::vector<std::future<absl::StatusOr<ac::DecodeAnswer>>> futures;
  std::vector<std::vector<float>> row_values;
  for (int64_t t = 0; t < rows; ++t) row_values.push_back(Slice(all, t, 1));
  for (int64_t t = 0; t < rows; ++t) {
    ac::DecodeMessage step;
    step.steps = {{.session = "s", .rows = RowsOf(row_values[t])}};
    futures.push_back(stream->SendAsync(step));
  }
  std::vector<float> outputs;
  for (auto& future : futures) {
    absl::StatusOr<ac::DecodeAnswer> answer = future.get();
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_TRUE(answer->steps[0].ok()) << answer->steps[0].status();
    outputs.insert(outputs.end(), answer->steps[0]->data.begin(), answer->steps[0]->data.end());
  }
  EXPECT_TRUE(Near(outputs, Core(all)));

  // The callback form, on a gRPC thread.
  const std::vector<float> extra = TestValues(kD, 6);
  Notification called;
  absl::StatusOr<ac::DecodeAnswer> seen = absl::UnknownError("not called");
  ac::DecodeMessage step;
  step.steps = {{.session = "s", .rows = RowsOf(extra)}};
  ASSERT_TRUE(stream
                  ->SendAsync(step,
                              [&](absl::StatusOr<ac::DecodeAnswer> answer) {
                                seen = std::move(answer);
                                called.Notify();
                              })
                  .ok());
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(seen.ok()) << seen.status();
  std::vector<float> longer = all;
  longer.insert(longer.end(), extra.begin(), extra.end());
  EXPECT_TRUE(Near(seen->steps[0]->data, Slice(Core(longer), rows, 1)));

  EXPECT_TRUE(stream->Close().ok());
  // After Close nothing is sent, and `done` is not called.
  bool late_called = false;
  const absl::Status late = stream->SendAsync(step, [&](auto) { late_called = true; });
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(late_called);
  EXPECT_EQ(stream->SendAsync(step).get().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(DecodeClientTest, BadItemsFailAloneAndTheOtherSessionsGoOn) {
  std::unique_ptr<ac::DecodeStream> stream = OpenStream();
  ASSERT_NE(stream, nullptr);
  const std::vector<float> good = TestValues(3 * kD, 7);
  const std::vector<float> wide = TestValues(kD + 1, 8);
  const std::vector<float> first_row = Slice(good, 0, 1);  // Views must outlive the Send.
  ac::DecodeMessage message;
  message.opens = {{.session = "ok", .model = kSmallModel},
                   {.session = "m", .model = "no-such-model"}};
  message.steps = {{.session = "ok", .rows = RowsOf(good)},
                   {.session = "nope", .rows = RowsOf(first_row)},
                   {.session = "ok", .rows = {wide, {1, kD + 1}}}};
  message.closes = {"never-opened"};
  absl::StatusOr<ac::DecodeAnswer> answer = stream->Send(message);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->opens[0].ok());
  EXPECT_EQ(answer->opens[1].status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(answer->steps[0].ok()) << answer->steps[0].status();
  EXPECT_TRUE(Near(answer->steps[0]->data, Core(good)));
  EXPECT_EQ(answer->steps[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(answer->steps[1].status().message(), HasSubstr("steps[1].session"));
  EXPECT_EQ(answer->steps[2].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(answer->steps[2].status().message(), HasSubstr("expected d_model 16"));
  EXPECT_EQ(answer->closes[0].code(), absl::StatusCode::kInvalidArgument);

  // A step whose data and shape disagree is refused by the library, before sending.
  const std::vector<float> short_row(kD - 1, 0.5f);
  EXPECT_EQ(stream->Step("ok", {short_row, {1, kD}}).status().code(),
            absl::StatusCode::kInvalidArgument);

  // "ok" went on: its next row extends the same causal sequence; then it closes.
  const std::vector<float> next = TestValues(kD, 9);
  std::vector<float> all = good;
  all.insert(all.end(), next.begin(), next.end());
  absl::StatusOr<ac::Tensor> out = stream->Step("ok", RowsOf(next));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(Near(out->data, Slice(Core(all), 3, 1)));
  EXPECT_TRUE(stream->CloseSession("ok").ok());
  EXPECT_EQ(stream->Step("ok", RowsOf(next)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ServerFreed());
}

TEST_F(DecodeClientTest, DecodeSessionStepsSyncAndAsyncAndClosesWithItsStream) {
  absl::StatusOr<std::unique_ptr<ac::DecodeSession>> session =
      client_->OpenDecodeSession({.session = "one", .model = kSmallModel});
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->opened().model_version, 1);
  const std::vector<float> all = TestValues(6 * kD, 10);
  const std::vector<float> prompt = Slice(all, 0, 4), r4 = Slice(all, 4, 1), r5 = Slice(all, 5, 1);
  absl::StatusOr<ac::Tensor> out = (*session)->Step(RowsOf(prompt));
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<float> outputs = out->data;
  std::future<absl::StatusOr<ac::Tensor>> f4 = (*session)->StepAsync(RowsOf(r4));
  std::future<absl::StatusOr<ac::Tensor>> f5 = (*session)->StepAsync(RowsOf(r5));
  for (auto* f : {&f4, &f5}) {
    absl::StatusOr<ac::Tensor> step = f->get();
    ASSERT_TRUE(step.ok()) << step.status();
    outputs.insert(outputs.end(), step->data.begin(), step->data.end());
  }
  EXPECT_TRUE(Near(outputs, Core(all)));
  EXPECT_EQ(server().decode_runtime().Stats().sessions_open, 1);
  EXPECT_TRUE((*session)->Close().ok());
  EXPECT_EQ((*session)->Step(RowsOf(r4)).status().code(), absl::StatusCode::kFailedPrecondition);
  session->reset();
  EXPECT_TRUE(ServerFreed());

  // An open that fails gives the open's error.
  absl::StatusOr<std::unique_ptr<ac::DecodeSession>> missing =
      client_->OpenDecodeSession({.session = "m", .model = "no-such-model"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->OpenDecodeStream({.max_in_flight = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DecodeClientTest, DestroyingTheStreamClosesItsSessions) {
  {
    std::unique_ptr<ac::DecodeStream> stream = OpenStream();
    ASSERT_NE(stream, nullptr);
    ac::DecodeMessage message;
    const std::vector<float> prompt = TestValues(20 * kD, 11);
    for (int i = 0; i < 4; ++i) {
      message.opens.push_back({.session = absl::StrCat("s", i), .model = kSmallModel});
      message.steps.push_back({.session = absl::StrCat("s", i), .rows = RowsOf(prompt)});
    }
    absl::StatusOr<ac::DecodeAnswer> answer = stream->Send(message);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(server().decode_runtime().Stats().sessions_open, 4);
    EXPECT_GT(server().decode_runtime().Stats().kv_bytes_used, 0);
  }
  EXPECT_TRUE(ServerFreed());
}

TEST_F(DecodeClientTest, AStreamEndedByTheServerFailsItsMessages) {
  std::unique_ptr<ac::DecodeStream> stream = OpenStream();
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(stream->Open({.session = "s", .model = kSmallModel}).ok());
  StopServer();
  const std::vector<float> row = TestValues(kD, 12);
  // Either the send finds the stream ended, or the message is failed with the stream's error.
  absl::StatusOr<ac::Tensor> out = stream->Step("s", RowsOf(row));
  EXPECT_FALSE(out.ok());
  EXPECT_FALSE(stream->Close().ok());
}

}  // namespace
}  // namespace attnserve::testing
