// attnserve.v1 Decode end to end: a real server on 127.0.0.1, sessions over gRPC streams compared
// with the core's full forward of the whole sequence, the stream owning its sessions (cancel frees
// the cache), the KV budget, per-item errors, request metrics, and drain.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_weights.h"
#include "core/model/model_writer.h"
#include "core/model/weight_naming.h"
#include "server/decoding/decode_runtime.h"
#include "tests/server/metrics/exposition.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing::decode_test {
namespace {

using Stream = grpc::ClientReaderWriter<v1::DecodeRequest, v1::DecodeResponse>;

v1::Tensor Rows(const std::vector<float>& values, int64_t width) {
  v1::Tensor tensor;
  tensor.add_shape(static_cast<int64_t>(values.size()) / width);
  tensor.add_shape(width);
  tensor.mutable_values()->Add(values.begin(), values.end());
  return tensor;
}

std::vector<float> Slice(const std::vector<float>& values, int64_t width, int64_t from,
                         int64_t rows) {
  return {values.begin() + from * width, values.begin() + (from + rows) * width};
}

void AddOpen(v1::DecodeRequest* request, const std::string& tag, const std::string& model,
             const std::vector<float>& memory = {}, int64_t width = 0) {
  v1::DecodeOpen* open = request->add_opens();
  open->set_session(tag);
  open->set_model(model);
  if (!memory.empty()) *open->mutable_memory() = Rows(memory, width);
}

void AddStep(v1::DecodeRequest* request, const std::string& tag, const std::vector<float>& rows,
             int64_t width) {
  v1::DecodeStep* step = request->add_steps();
  step->set_session(tag);
  *step->mutable_rows() = Rows(rows, width);
}

// One stream with a 30 s deadline; Call() writes a message and reads its answer.
class DecodeStream {
 public:
  explicit DecodeStream(v1::AttentionService::Stub& stub) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream_ = stub.Decode(&context_);
  }
  v1::DecodeResponse Call(const v1::DecodeRequest& request) {
    v1::DecodeResponse response;
    EXPECT_TRUE(stream_->Write(request));
    EXPECT_TRUE(stream_->Read(&response));
    EXPECT_EQ(response.request_id(), request.request_id());
    return response;
  }
  grpc::Status Close() {
    stream_->WritesDone();
    v1::DecodeResponse extra;
    EXPECT_FALSE(stream_->Read(&extra));
    return stream_->Finish();
  }
  grpc::ClientContext& context() { return context_; }
  Stream& stream() { return *stream_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<Stream> stream_;
};

class DecodeTest : public ServerTest {
 protected:
  // Opens two self-attention sessions of the small model on `stream`, each with a prompt of the
  // given rows (values from seeds 5 and 6), and returns the answer.
  v1::DecodeResponse OpenTwo(DecodeStream& stream, const std::string& first, int64_t first_rows,
                             const std::string& second, int64_t second_rows) {
    v1::DecodeRequest open;
    AddOpen(&open, first, kSmallModel);
    AddOpen(&open, second, kSmallModel);
    AddStep(&open, first, TestValues(first_rows * kSmallWidth, 5), kSmallWidth);
    AddStep(&open, second, TestValues(second_rows * kSmallWidth, 6), kSmallWidth);
    v1::DecodeResponse answer = stream.Call(open);
    EXPECT_EQ(answer.steps_size(), 2);
    return answer;
  }
  decoding::DecodeRuntime& runtime() { return server().decode_runtime(); }
  // Waits (bounded) until the runtime holds no session and no cache, and has counted
  // `closed` closes in all (a close is counted after the session leaves the open ones).
  ::testing::AssertionResult AllFreed(int64_t closed) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    decoding::DecodeStats stats = runtime().Stats();
    const auto closes = [&] {
      int64_t total = 0;
      for (int64_t count : stats.sessions_closed) total += count;
      return total;
    };
    while (stats.sessions_open != 0 || stats.kv_bytes_used != 0 || closes() != closed) {
      if (std::chrono::steady_clock::now() > give_up) {
        return ::testing::AssertionFailure()
               << stats.sessions_open << " sessions, " << stats.kv_bytes_used
               << " bytes still held, " << closes() << " closes counted of " << closed;
      }
      std::this_thread::yield();
      stats = runtime().Stats();
    }
    return ::testing::AssertionSuccess();
  }
  std::vector<float> StepOutput(const v1::DecodeResponse& response, int index) {
    const v1::DecodeStepResult& step = response.steps(index);
    EXPECT_FALSE(step.has_error()) << step.error().message();
    return TensorValues(step.output());
  }
};

TEST_F(DecodeTest, InterleavedSelfAndCrossSessionsEqualTheCoreForward) {
  StartServer();
  const int64_t d = kSmallWidth;
  const int64_t length = 7;  // 3 prompt rows, then 4 one-row steps.
  const std::vector<float> self_rows = TestValues(length * d, 1);
  const std::vector<float> cross_rows = TestValues(length * d, 2);
  const std::vector<float> memory = TestValues(5 * d, 3);
  const std::vector<float> single_rows = TestValues(length * kSingleWidth, 4);

  DecodeStream a(stub());
  DecodeStream b(stub());  // A second stream, interleaved with the first.
  v1::DecodeRequest open;
  open.set_request_id("open");
  AddOpen(&open, "s", kSmallModel);
  AddOpen(&open, "x", kSmallModel, memory, d);
  AddStep(&open, "s", Slice(self_rows, d, 0, 3), d);  // Prefill in the opening message.
  AddStep(&open, "x", Slice(cross_rows, d, 0, 3), d);
  v1::DecodeRequest open_b;
  open_b.set_request_id("open-b");
  AddOpen(&open_b, "s", kSingleModel);  // Same tag, other stream: another session.
  AddStep(&open_b, "s", Slice(single_rows, kSingleWidth, 0, 3), kSingleWidth);

  const v1::DecodeResponse opened = a.Call(open);
  const v1::DecodeResponse opened_b = b.Call(open_b);
  ASSERT_EQ(opened.opens_size(), 2);
  for (const v1::DecodeOpenResult& result : opened.opens()) {
    EXPECT_FALSE(result.has_error()) << result.error().message();
    EXPECT_EQ(result.model(), kSmallModel);
    EXPECT_EQ(result.model_version(), 1);
  }
  ASSERT_EQ(opened.steps_size(), 2);
  std::vector<float> self_out = StepOutput(opened, 0);
  std::vector<float> cross_out = StepOutput(opened, 1);
  std::vector<float> single_out = StepOutput(opened_b, 0);
  EXPECT_EQ(TensorShape(opened.steps(0).output()), (std::vector<int64_t>{3, d}));

  v1::GetModelRequest get;
  get.set_name(kSmallModel);
  v1::ModelInfo info;
  grpc::ClientContext get_context;
  ASSERT_TRUE(stub().GetModel(&get_context, get, &info).ok());
  EXPECT_EQ(info.decode_sessions(), 2);

  for (int64_t t = 3; t < length; ++t) {
    v1::DecodeRequest step;  // Both sessions of stream a in one message.
    step.set_request_id("step-" + std::to_string(t));
    AddStep(&step, "s", Slice(self_rows, d, t, 1), d);
    AddStep(&step, "x", Slice(cross_rows, d, t, 1), d);
    v1::DecodeRequest step_b;
    step_b.set_request_id("b-" + std::to_string(t));
    AddStep(&step_b, "s", Slice(single_rows, kSingleWidth, t, 1), kSingleWidth);
    ASSERT_TRUE(a.stream().Write(step));
    const v1::DecodeResponse answer_b = b.Call(step_b);
    v1::DecodeResponse answer;
    ASSERT_TRUE(a.stream().Read(&answer));
    ASSERT_EQ(answer.steps_size(), 2);
    for (float v : StepOutput(answer, 0)) self_out.push_back(v);
    for (float v : StepOutput(answer, 1)) cross_out.push_back(v);
    for (float v : StepOutput(answer_b, 0)) single_out.push_back(v);
  }
  EXPECT_TRUE(Near(self_out,
                   CoreCompute(*Layer(kSmallModel), {.query = self_rows, .causal = true}).output));
  EXPECT_TRUE(Near(
      cross_out, CoreCompute(*Layer(kSmallModel), {.query = cross_rows, .memory = memory}).output));
  EXPECT_TRUE(
      Near(single_out,
           CoreCompute(*Layer(kSingleModel), {.query = single_rows, .causal = true}).output));

  v1::DecodeRequest close;
  close.set_request_id("close");
  close.add_closes()->set_session("s");
  close.add_closes()->set_session("x");
  const v1::DecodeResponse closed = a.Call(close);
  ASSERT_EQ(closed.closes_size(), 2);
  EXPECT_FALSE(closed.closes(0).has_error());
  EXPECT_FALSE(closed.closes(1).has_error());
  EXPECT_TRUE(a.Close().ok());
  EXPECT_TRUE(b.Close().ok());  // Ends with its session open: the stream closes it.
  EXPECT_TRUE(AllFreed(3));
  const decoding::DecodeStats stats = runtime().Stats();
  EXPECT_EQ(stats.sessions_closed[static_cast<int>(decoding::CloseReason::kClient)], 2);
  EXPECT_EQ(stats.sessions_closed[static_cast<int>(decoding::CloseReason::kOwnerGone)], 1);
}

TEST_F(DecodeTest, CancelledStreamFreesAllItsCache) {
  StartServer();
  DecodeStream a(stub());
  const v1::DecodeResponse opened = OpenTwo(a, "p", 40, "q", 20);
  ASSERT_EQ(opened.steps_size(), 2);
  EXPECT_FALSE(opened.steps(0).has_error());
  EXPECT_GT(runtime().Stats().kv_bytes_used, 0);
  EXPECT_EQ(runtime().Stats().sessions_open, 2);

  a.context().TryCancel();
  EXPECT_EQ(a.stream().Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(AllFreed(2));
  EXPECT_EQ(runtime().Stats().sessions_closed[static_cast<int>(decoding::CloseReason::kOwnerGone)],
            2);

  // The same, as Prometheus sees it (the listener hears of a close just after Stats counts it).
  absl::StatusOr<Samples> samples = Scrape(server().metrics_port());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (samples.ok() &&
         ValueOf(*samples, "attnserve_decode_sessions_closed_total{reason=\"owner_gone\"}") != 2 &&
         std::chrono::steady_clock::now() < give_up) {
    samples = Scrape(server().metrics_port());
  }
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(ValueOf(*samples, "attnserve_kv_cache_bytes{state=\"used\"}"), 0);
  // The version's pool went with its last session: none of its pages are held.
  EXPECT_EQ(ValueOf(*samples, "attnserve_kv_cache_bytes{state=\"touched\"}"), 0);
  EXPECT_EQ(ValueOf(*samples, "attnserve_kv_cache_bytes{state=\"capacity\"}"),
            static_cast<double>(runtime().options().kv.budget_bytes));
  EXPECT_EQ(ValueOf(*samples, "attnserve_decode_sessions_open"), 0);
  EXPECT_EQ(ValueOf(*samples, "attnserve_decode_sessions_closed_total{reason=\"owner_gone\"}"), 2);
  EXPECT_EQ(ValueOf(*samples, "attnserve_decode_sessions_closed_total{reason=\"client\"}"), 0);
  EXPECT_EQ(ValueOf(*samples, "attnserve_decode_tokens_total{kind=\"prefill\"}"), 60);
  EXPECT_EQ(ValueOf(*samples, "attnserve_decode_step_latency_seconds_count"), 2);
  EXPECT_GE(ValueOf(*samples, "attnserve_decode_iteration_tokens_count"), 1);
  // Every iteration's compute time is observed, and it took some.
  EXPECT_EQ(ValueOf(*samples, "attnserve_decode_iteration_seconds_count"),
            ValueOf(*samples, "attnserve_decode_iteration_tokens_count"));
  EXPECT_GT(ValueOf(*samples, "attnserve_decode_iteration_seconds_sum"), 0);
}

TEST_F(DecodeTest, BudgetExhaustionFailsOneStepWhileOthersContinue) {
  server::ServerOptions options = TestServerOptions();
  options.decoding.kv.budget_bytes = 64 << 10;
  StartServer(options);
  const int64_t d = kSmallWidth;
  DecodeStream a(stub());
  const v1::DecodeResponse answer = OpenTwo(a, "small", 4, "huge", 2000);
  ASSERT_EQ(answer.steps_size(), 2);
  EXPECT_FALSE(answer.steps(0).has_error()) << answer.steps(0).error().message();
  ASSERT_TRUE(answer.steps(1).has_error());
  EXPECT_EQ(answer.steps(1).error().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(answer.steps(1).error().message().find("budget_bytes 65536"), std::string::npos)
      << answer.steps(1).error().message();
  EXPECT_NE(answer.steps(1).error().message().find("in use"), std::string::npos);

  // Both sessions go on: the failed step left "huge" unchanged.
  v1::DecodeRequest next;
  AddStep(&next, "small", TestValues(d, 9), d);
  AddStep(&next, "huge", TestValues(d, 10), d);
  const v1::DecodeResponse again = a.Call(next);
  EXPECT_FALSE(again.steps(0).has_error());
  EXPECT_FALSE(again.steps(1).has_error());
  std::vector<float> huge = TestValues(d, 10);
  EXPECT_TRUE(Near(StepOutput(again, 1),
                   CoreCompute(*Layer(kSmallModel), {.query = huge, .causal = true}).output));
  EXPECT_TRUE(a.Close().ok());
  EXPECT_TRUE(AllFreed(2));
}

TEST_F(DecodeTest, BadItemsFailAloneWithClearErrors) {
  StartServer();
  const int64_t d = kSmallWidth;
  DecodeStream a(stub());
  v1::DecodeRequest request;
  request.set_request_id("mixed");
  AddOpen(&request, "ok", kSmallModel);
  AddOpen(&request, "ok", kSmallModel);  // Duplicate tag.
  AddOpen(&request, "v", kSmallModel);
  request.mutable_opens(2)->set_expected_version(7);  // Model version mismatch.
  AddOpen(&request, "m", "no-such-model");
  const std::vector<float> good = TestValues(2 * d, 11);
  AddStep(&request, "ok", good, d);
  AddStep(&request, "nope", TestValues(d, 12), d);        // Unknown tag.
  AddStep(&request, "ok", TestValues(d + 1, 13), d + 1);  // Wrong width.
  std::vector<float> nan_row = TestValues(d, 14);
  nan_row[3] = std::numeric_limits<float>::quiet_NaN();
  AddStep(&request, "ok", nan_row, d);
  request.add_closes()->set_session("never-opened");

  const v1::DecodeResponse answer = a.Call(request);
  ASSERT_EQ(answer.opens_size(), 4);
  EXPECT_FALSE(answer.opens(0).has_error()) << answer.opens(0).error().message();
  EXPECT_EQ(answer.opens(1).error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(answer.opens(1).error().message().find("opens[1].session"), std::string::npos)
      << answer.opens(1).error().message();
  EXPECT_EQ(answer.opens(2).error().code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(answer.opens(2).error().message().find("opens[2].expected_version: expected the "
                                                   "served version 1"),
            std::string::npos)
      << answer.opens(2).error().message();
  EXPECT_EQ(answer.opens(3).error().code(), grpc::StatusCode::NOT_FOUND);

  ASSERT_EQ(answer.steps_size(), 4);
  EXPECT_TRUE(Near(StepOutput(answer, 0),
                   CoreCompute(*Layer(kSmallModel), {.query = good, .causal = true}).output));
  EXPECT_EQ(answer.steps(1).error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(answer.steps(1).error().message().find("steps[1].session: expected a session open"),
            std::string::npos)
      << answer.steps(1).error().message();
  EXPECT_NE(answer.steps(2).error().message().find("steps[2].rows.shape[1]: expected d_model 16"),
            std::string::npos)
      << answer.steps(2).error().message();
  EXPECT_NE(answer.steps(3).error().message().find("steps[3].rows[0, 3]: expected a finite value"),
            std::string::npos)
      << answer.steps(3).error().message();
  ASSERT_EQ(answer.closes_size(), 1);
  EXPECT_EQ(answer.closes(0).error().code(), grpc::StatusCode::INVALID_ARGUMENT);

  // The good session went on: its next row extends the same causal sequence.
  std::vector<float> all = good;
  const std::vector<float> next_row = TestValues(d, 15);
  all.insert(all.end(), next_row.begin(), next_row.end());
  v1::DecodeRequest next;
  AddStep(&next, "ok", next_row, d);
  const v1::DecodeResponse next_answer = a.Call(next);
  EXPECT_TRUE(Near(
      StepOutput(next_answer, 0),
      Slice(CoreCompute(*Layer(kSmallModel), {.query = all, .causal = true}).output, d, 2, 1)));

  // (Bytes that are no DecodeRequest at all: wire_parsing_test.)
  EXPECT_TRUE(a.Close().ok());
  EXPECT_TRUE(AllFreed(1));
}

TEST_F(DecodeTest, EachMessageCountsAsOneDecodeRequestWithItsFirstFailedItemsCode) {
  StartServer();
  const int64_t d = kSmallWidth;
  DecodeStream a(stub());
  v1::DecodeRequest open;
  AddOpen(&open, "s", kSmallModel);
  AddStep(&open, "s", TestValues(2 * d, 1), d);
  ASSERT_FALSE(a.Call(open).steps(0).has_error());
  v1::DecodeRequest step;
  AddStep(&step, "s", TestValues(d, 2), d);
  ASSERT_FALSE(a.Call(step).steps(0).has_error());
  v1::DecodeRequest mixed;  // A good step, then one of the wrong width: the message failed.
  AddStep(&mixed, "s", TestValues(d, 3), d);
  AddStep(&mixed, "s", TestValues(d + 1, 4), d + 1);
  const v1::DecodeResponse mixed_answer = a.Call(mixed);
  EXPECT_FALSE(mixed_answer.steps(0).has_error());
  EXPECT_EQ(mixed_answer.steps(1).error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::DecodeRequest stranger;  // A tag not open on the stream: no model to count it under.
  AddStep(&stranger, "nope", TestValues(d, 5), d);
  EXPECT_EQ(a.Call(stranger).steps(0).error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(a.Close().ok());

  // Each message is recorded before its answer is queued: no waiting needed.
  const absl::StatusOr<Samples> samples = Scrape(server().metrics_port());
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(
      ValueOf(*samples, "attnserve_requests_total{code=\"OK\",method=\"Decode\",model=\"small\"}"),
      2);
  EXPECT_EQ(ValueOf(*samples,
                    "attnserve_requests_total{code=\"INVALID_ARGUMENT\","
                    "method=\"Decode\",model=\"small\"}"),
            1);
  EXPECT_EQ(ValueOf(*samples,
                    "attnserve_requests_total{code=\"INVALID_ARGUMENT\","
                    "method=\"Decode\",model=\"<unknown>\"}"),
            1);
  EXPECT_EQ(ValueOf(*samples,
                    "attnserve_request_duration_seconds_count{method=\"Decode\","
                    "model=\"small\"}"),
            3);
  EXPECT_EQ(ValueOf(*samples, "attnserve_inflight_requests"), 0);
}

TEST_F(DecodeTest, DrainAnswersAcceptedStepsThenEndsTheStreamUnavailable) {
  StartServer();
  const int64_t d = kSmallWidth;
  DecodeStream a(stub());
  v1::DecodeRequest open;
  AddOpen(&open, "s", kSmallModel);
  ASSERT_FALSE(a.Call(open).opens(0).has_error());

  runtime().Pause();  // Holds the step accepted until the drain has begun.
  const std::vector<float> rows = TestValues(3 * d, 16);
  v1::DecodeRequest step;
  step.set_request_id("held");
  AddStep(&step, "s", rows, d);
  ASSERT_TRUE(a.stream().Write(step));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (runtime().Stats().steps_queued != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::yield();
  }
  std::thread shutdown([this] { server().Shutdown(absl::Seconds(20)); });
  // The drain resumes the runtime (DecodeRuntime::Drain) after the streams stopped reading.
  v1::DecodeResponse answer;
  ASSERT_TRUE(a.stream().Read(&answer));
  EXPECT_EQ(answer.request_id(), "held");
  EXPECT_TRUE(Near(StepOutput(answer, 0),
                   CoreCompute(*Layer(kSmallModel), {.query = rows, .causal = true}).output));
  EXPECT_FALSE(a.stream().Read(&answer));
  const grpc::Status status = a.stream().Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  shutdown.join();
  EXPECT_EQ(runtime().Stats().sessions_open, 0);
  EXPECT_EQ(runtime().Stats().kv_bytes_used, 0);
}

TEST_F(DecodeTest, ASessionKeepsItsVersionAcrossAReloadAndModelInfoListsThatVersion) {
  server::ServerOptions options = TestServerOptions();
  options.model_poll_interval_ms = 20;
  StartServer(options);
  const int64_t d = kSmallWidth;
  const std::vector<float> rows = TestValues(4 * d, 21);
  const std::shared_ptr<const core::AttentionLayer> first = Layer(kSmallModel);
  DecodeStream a(stub());
  v1::DecodeRequest open;
  AddOpen(&open, "s", kSmallModel);
  AddStep(&open, "s", Slice(rows, d, 0, 3), d);
  ASSERT_FALSE(a.Call(open).steps(0).has_error());

  model::ModelConfig config;
  config.attention = {.d_model = d,
                      .num_heads = kSmallHeads,
                      .variant = core::AttentionVariant::kMultiHead,
                      .bias = true};
  ASSERT_TRUE(model::WriteModelFolder(repository() / kSmallModel, config,
                                      core::MakeRandomWeights(config.attention, 999),
                                      model::WeightNaming::kSeed, model::TensorDtype::kF32)
                  .ok());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (server().router().Route(kSmallModel)->model->version != 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::yield();
  }
  const auto model_info = [&] {
    v1::GetModelRequest get;
    get.set_name(kSmallModel);
    v1::ModelInfo info;
    grpc::ClientContext context;
    EXPECT_TRUE(stub().GetModel(&context, get, &info).ok());
    return info;
  };
  v1::ModelInfo info = model_info();
  EXPECT_EQ(info.version(), 2);
  EXPECT_EQ(info.decode_sessions(), 0);
  ASSERT_EQ(info.retired_versions_size(), 1);
  EXPECT_EQ(info.retired_versions(0).version(), 1);
  EXPECT_EQ(info.retired_versions(0).decode_sessions(), 1);

  // The session's step still computes with version 1, whose cache it holds.
  v1::DecodeRequest step;
  AddStep(&step, "s", Slice(rows, d, 3, 1), d);
  v1::DecodeClose* close = step.add_closes();
  close->set_session("s");
  const std::vector<float> full = CoreCompute(*first, {.query = rows, .causal = true}).output;
  EXPECT_TRUE(Near(StepOutput(a.Call(step), 0), Slice(full, d, 3, 1)));
  ASSERT_TRUE(AllFreed(1));
  EXPECT_EQ(model_info().retired_versions_size(), 0);  // Version 1 left with its last session.
  EXPECT_TRUE(a.Close().ok());
}

TEST_F(DecodeTest, AnIdleSessionIsClosedAndFreedWhileItsStreamGoesOn) {
  server::ServerOptions options = TestServerOptions();
  options.decoding.idle_timeout_us = 100'000;
  StartServer(options);
  const int64_t d = kSmallWidth;
  DecodeStream a(stub());
  v1::DecodeRequest open;
  AddOpen(&open, "s", kSmallModel);
  AddStep(&open, "s", TestValues(3 * d, 30), d);
  ASSERT_FALSE(a.Call(open).steps(0).has_error());
  ASSERT_GT(runtime().Stats().kv_bytes_used, 0);

  // The stream stays open; the session has no step for the idle timeout.
  ASSERT_TRUE(AllFreed(1));
  EXPECT_EQ(runtime().Stats().sessions_closed[static_cast<int>(decoding::CloseReason::kIdle)], 1);
  v1::DecodeRequest late;
  AddStep(&late, "s", TestValues(d, 31), d);
  const v1::DecodeResponse refused = a.Call(late);
  ASSERT_TRUE(refused.steps(0).has_error());
  EXPECT_EQ(refused.steps(0).error().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(refused.steps(0).error().message().find("closed by the server (idle)"),
            std::string::npos)
      << refused.steps(0).error().message();

  v1::DecodeRequest again;  // The stream still serves new sessions.
  AddOpen(&again, "t", kSmallModel);
  AddStep(&again, "t", TestValues(2 * d, 32), d);
  const v1::DecodeResponse reopened = a.Call(again);
  EXPECT_FALSE(reopened.opens(0).has_error()) << reopened.opens(0).error().message();
  EXPECT_FALSE(reopened.steps(0).has_error()) << reopened.steps(0).error().message();

  // The idle session's tag is free again: the same tag opens a new session at once.
  v1::DecodeRequest same_tag;
  AddOpen(&same_tag, "s", kSmallModel);
  AddStep(&same_tag, "s", TestValues(d, 33), d);
  const v1::DecodeResponse fresh = a.Call(same_tag);
  EXPECT_FALSE(fresh.opens(0).has_error()) << fresh.opens(0).error().message();
  EXPECT_FALSE(fresh.steps(0).has_error()) << fresh.steps(0).error().message();
}

// A session the server closes frees its tag whether or not the client ever uses it again: a
// client that lets many sessions idle out under new tags is not refused for tags it no longer
// holds, and closing a tag the server closed is answered OK.
TEST_F(DecodeTest, TagsOfSessionsTheServerClosedAreFreed) {
  server::ServerOptions options = TestServerOptions();
  options.decoding.idle_timeout_us = 50'000;
  StartServer(options);
  const int64_t d = kSmallWidth;
  DecodeStream a(stub());
  for (int round = 0; round < 3; ++round) {
    v1::DecodeRequest open;
    for (int i = 0; i < 4; ++i) {
      const std::string tag = absl::StrCat("r", round, "-", i);
      AddOpen(&open, tag, kSmallModel);
      AddStep(&open, tag, TestValues(2 * d, 40 + i), d);
    }
    const v1::DecodeResponse opened = a.Call(open);
    for (const v1::DecodeStepResult& step : opened.steps()) {
      ASSERT_FALSE(step.has_error()) << step.error().message();
    }
    ASSERT_TRUE(AllFreed(4 * (round + 1)));
  }
  v1::DecodeRequest close;
  close.add_closes()->set_session("r0-0");
  const v1::DecodeResponse closed = a.Call(close);
  EXPECT_FALSE(closed.closes(0).has_error()) << closed.closes(0).error().message();
  // Every tag is free: a step on an unknown tag lists none as open.
  v1::DecodeRequest late;
  AddStep(&late, "nope", TestValues(d, 50), d);
  const v1::DecodeResponse refused = a.Call(late);
  ASSERT_TRUE(refused.steps(0).has_error());
  EXPECT_NE(refused.steps(0).error().message().find("none are open"), std::string::npos)
      << refused.steps(0).error().message();
}

}  // namespace
}  // namespace attnserve::testing::decode_test
