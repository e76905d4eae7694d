// attnserve::client::Client against a real in-process server on 127.0.0.1: answers equal the
// core's, async and streaming paths, deadlines, errors, health and model calls.
#include "attnserve/client/client.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/client/infer_client.h"
#include "core/util/float_format.h"
#include "core/util/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;
namespace ac = ::attnserve::client;

class ClientTest : public ServerTest {
 protected:
  void StartWith(server::ServerOptions options = TestServerOptions(),
                 ac::ClientOptions client_options = {}) {
    StartServer(std::move(options));
    absl::StatusOr<std::unique_ptr<ac::Client>> created =
        ac::Client::Create(absl::StrCat("127.0.0.1:", server().port()), client_options);
    ASSERT_TRUE(created.ok()) << created.status();
    client_ = *std::move(created);
  }

  // What the core computes for `values` ([rows, width]) with the serving `model`.
  std::vector<float> Expected(const std::string& model, const std::vector<float>& values,
                              bool causal = false) {
    return CoreCompute(*Layer(model), {.query = values, .causal = causal}).output;
  }

  ac::Client& client() { return *client_; }

 private:
  std::unique_ptr<ac::Client> client_;
};

TEST_F(ClientTest, AttendEqualsTheCoreWithRawAndWithValues) {
  StartWith();
  const std::vector<float> input = TestValues(5 * kSmallWidth, 1);
  for (bool raw : {true, false}) {
    absl::StatusOr<ac::AttendResult> result =
        client().Attend(kSmallModel, {input, {5, kSmallWidth}},
                        {.mask = ac::Mask::kCausal, .request_id = "r1", .raw = raw});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output.shape, (std::vector<int64_t>{5, kSmallWidth}));
    EXPECT_TRUE(Near(result->output.data, Expected(kSmallModel, input, /*causal=*/true)));
    EXPECT_EQ(result->model, kSmallModel);
    EXPECT_EQ(result->model_version, 1);
    EXPECT_EQ(result->request_id, "r1");
    EXPECT_EQ(result->timing.batch_tokens, 5);
    EXPECT_GT(result->latency.count(), 0);
  }
}

TEST_F(ClientTest, SixteenBitWireHalvesTheBytesAndAnswersInFloat32) {
  StartWith();
  const int64_t rows = 64;
  const std::vector<float> input = TestValues(rows * kSmallWidth, 5);
  const ac::AttendOptions fp32_options{.return_weights = true};
  absl::StatusOr<ac::AttendResult> fp32 =
      client().Attend(kSmallModel, {input, {rows, kSmallWidth}}, fp32_options);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  for (ac::WireDtype dtype : {ac::WireDtype::kBFloat16, ac::WireDtype::kFloat16}) {
    SCOPED_TRACE(std::string(ac::WireDtypeName(dtype)));
    const FloatFormat format =
        dtype == ac::WireDtype::kBFloat16 ? FloatFormat::kBFloat16 : FloatFormat::kFloat16;
    const double unit_roundoff = std::ldexp(1.0, dtype == ac::WireDtype::kBFloat16 ? -8 : -11);
    ac::AttendOptions options = fp32_options;
    options.wire_dtype = dtype;
    options.answer_wire_dtype = dtype;
    absl::StatusOr<ac::AttendResult> half =
        client().Attend(kSmallModel, {input, {rows, kSmallWidth}}, options);
    ASSERT_TRUE(half.ok()) << half.status();
    // The server saw the rounded input; the answer is its float32 answer rounded once.
    std::string bytes(input.size() * 2, '\0');
    EncodeFloats(input, format, bytes.data());
    std::vector<float> rounded(input.size());
    DecodeFloats(bytes.data(), static_cast<int64_t>(input.size()), format, rounded.data());
    const std::vector<float> expected = Expected(kSmallModel, rounded);
    ASSERT_EQ(half->output.data.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_LE(std::fabs(half->output.data[i] - expected[i]),
                unit_roundoff * std::fabs(expected[i]) + 1e-5)
          << i;
    }
    ASSERT_TRUE(half->weights.has_value());
    EXPECT_EQ(half->weights->shape, fp32->weights->shape);
    // Half the bytes each way, to within the messages' few bytes of fields.
    EXPECT_NEAR(static_cast<double>(half->request_bytes) / static_cast<double>(fp32->request_bytes),
                0.5, 0.02);
    EXPECT_NEAR(
        static_cast<double>(half->response_bytes) / static_cast<double>(fp32->response_bytes), 0.5,
        0.02);
  }
  EXPECT_GT(fp32->request_bytes, rows * kSmallWidth * 4);
  EXPECT_GT(fp32->response_bytes, rows * kSmallWidth * 4);
}

// attn_mask is a mask, not data: with a 16-bit wire it keeps its meaning (non-zero allowed, 0
// blocked, non-finite refused). 1e-8 (0 in f16) stays allowed and 1e6 and 7e4 (inf in f16) stay
// allowed finite values: the answer is the core's for the rounded input and the same mask.
TEST_F(ClientTest, AnAttnMaskKeepsItsMeaningOnASixteenBitWire) {
  StartWith();
  const int64_t rows = 4;
  const std::vector<float> input = TestValues(rows * kSmallWidth, 9);
  // Row-major [4, 4]: every row has an allowed key; the tiny and huge values are allowed ones.
  const std::vector<float> mask = {1e-8f, 0.0f,  0.0f,  0.0f,  //
                                   0.0f,  1e6f,  1e-8f, 0.0f,  //
                                   1.0f,  0.0f,  7e4f,  0.0f,  //
                                   1e6f,  1e-8f, 0.0f,  2.0f};
  std::vector<uint8_t> allowed;
  for (float value : mask) allowed.push_back(value != 0.0f ? 1 : 0);
  for (ac::WireDtype dtype :
       {ac::WireDtype::kFloat32, ac::WireDtype::kFloat16, ac::WireDtype::kBFloat16}) {
    SCOPED_TRACE(std::string(ac::WireDtypeName(dtype)));
    absl::StatusOr<ac::AttendResult> result =
        client().Attend(kSmallModel, {input, {rows, kSmallWidth}},
                        {.attn_mask = ac::TensorView{mask, {rows, rows}},
                         .return_weights = true,
                         .wire_dtype = dtype});
    ASSERT_TRUE(result.ok()) << result.status();
    // The server saw the input rounded to the wire's type, and the mask as it was.
    std::vector<float> rounded = input;
    if (dtype != ac::WireDtype::kFloat32) {
      const FloatFormat format =
          dtype == ac::WireDtype::kBFloat16 ? FloatFormat::kBFloat16 : FloatFormat::kFloat16;
      std::string bytes(input.size() * 2, '\0');
      EncodeFloats(input, format, bytes.data());
      DecodeFloats(bytes.data(), static_cast<int64_t>(input.size()), format, rounded.data());
    }
    const CoreAnswer core =
        CoreCompute(*Layer(kSmallModel), {.query = rounded, .mask = allowed, .weights = true});
    EXPECT_TRUE(Near(result->output.data, core.output));
    ASSERT_TRUE(result->weights.has_value());
    EXPECT_TRUE(Near(result->weights->data, core.weights));
  }
  // A non-finite mask value is refused alike whatever the wire carries.
  std::vector<float> infinite = mask;
  infinite[1] = -std::numeric_limits<float>::infinity();
  absl::StatusOr<ac::AttendResult> fp32 =
      client().Attend(kSmallModel, {input, {rows, kSmallWidth}},
                      {.attn_mask = ac::TensorView{infinite, {rows, rows}}});
  EXPECT_EQ(fp32.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fp32.status().message(), HasSubstr("attn_mask"));
  absl::StatusOr<ac::AttendResult> f16 = client().Attend(
      kSmallModel, {input, {rows, kSmallWidth}},
      {.attn_mask = ac::TensorView{infinite, {rows, rows}}, .wire_dtype = ac::WireDtype::kFloat16});
  EXPECT_EQ(f16.status(), fp32.status());
}

TEST_F(ClientTest, SixteenBitWireNeedsRaw) {
  StartWith();
  const std::vector<float> input = TestValues(2 * kSmallWidth, 6);
  absl::StatusOr<ac::AttendResult> result =
      client().Attend(kSmallModel, {input, {2, kSmallWidth}},
                      {.raw = false, .wire_dtype = ac::WireDtype::kFloat16});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("wire_dtype: f16 needs raw = true"));
  result = client().Attend(kSmallModel, {input, {2, kSmallWidth}},
                           {.raw = false, .answer_wire_dtype = ac::WireDtype::kBFloat16});
  EXPECT_THAT(result.status().message(), HasSubstr("answer_wire_dtype: bf16 needs raw = true"));
}

TEST_F(ClientTest, WeightsComeBackPerHead) {
  StartWith();
  const std::vector<float> input = TestValues(3 * kSmallWidth, 2);
  absl::StatusOr<ac::AttendResult> result =
      client().Attend(kSmallModel, {input, {3, kSmallWidth}}, {.return_weights = true});
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->weights.has_value());
  EXPECT_EQ(result->weights->shape, (std::vector<int64_t>{kSmallHeads, 3, 3}));
  const CoreAnswer core = CoreCompute(*Layer(kSmallModel), {.query = input, .weights = true});
  EXPECT_TRUE(Near(result->weights->data, core.weights));
}

TEST_F(ClientTest, AsyncCallbackAndFutureGiveTheCoresAnswer) {
  StartWith();
  const std::vector<float> input = TestValues(4 * kSingleWidth, 3);
  std::future<absl::StatusOr<ac::AttendResult>> future =
      client().AttendAsync(kSingleModel, {input, {4, kSingleWidth}});
  Notification called;
  absl::StatusOr<ac::AttendResult> from_callback;
  client().AttendAsync(kSingleModel, {input, {4, kSingleWidth}}, {},
                       [&](absl::StatusOr<ac::AttendResult> result) {
                         from_callback = std::move(result);
                         called.Notify();
                       });
  ASSERT_EQ(future.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  absl::StatusOr<ac::AttendResult> from_future = future.get();
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(from_future.ok()) << from_future.status();
  ASSERT_TRUE(from_callback.ok()) << from_callback.status();
  // Not bit for bit with each other: the two may share a batch or not, and oneDNN's gemm on
  // AVX2 may sum in another order for another row count.
  EXPECT_TRUE(Near(from_future->output.data, Expected(kSingleModel, input)));
  EXPECT_TRUE(Near(from_callback->output.data, Expected(kSingleModel, input)));
}

TEST_F(ClientTest, ASessionAnswersEveryRequestAndKeepsGoingAfterABadOne) {
  StartWith();
  std::mutex mu;
  std::map<std::string, absl::StatusOr<ac::AttendResult>> answers;
  std::vector<std::vector<float>> inputs;
  for (int i = 0; i < 30; ++i) inputs.push_back(TestValues((1 + i % 7) * kSmallWidth, 100 + i));
  absl::StatusOr<std::unique_ptr<ac::AttendSession>> session = client().OpenSession(4);
  ASSERT_TRUE(session.ok()) << session.status();
  for (int i = 0; i < 30; ++i) {
    const int64_t rows = 1 + i % 7;
    // Message 10 has the wrong width: answered with INVALID_ARGUMENT, the stream goes on.
    const int64_t width = i == 10 ? kSmallWidth - 1 : kSmallWidth;
    std::vector<float> data = inputs[i];
    if (i == 10) data.resize(rows * width);
    ASSERT_TRUE((*session)
                    ->Attend(kSmallModel, {data, {rows, width}},
                             {.request_id = absl::StrCat("m", i)},
                             [&, i](absl::StatusOr<ac::AttendResult> result) {
                               std::lock_guard<std::mutex> lock(mu);
                               answers.emplace(absl::StrCat("m", i), std::move(result));
                             })
                    .ok());
  }
  EXPECT_TRUE((*session)->Close().ok());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(answers.size(), 30u);
  for (int i = 0; i < 30; ++i) {
    const absl::StatusOr<ac::AttendResult>& answer = answers.at(absl::StrCat("m", i));
    if (i == 10) {
      EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(answer.status().message(), HasSubstr("input.shape"));
      continue;
    }
    ASSERT_TRUE(answer.ok()) << i << ": " << answer.status();
    EXPECT_TRUE(Near(answer->output.data, Expected(kSmallModel, inputs[i]))) << i;
  }
  // After Close, the session refuses.
  EXPECT_EQ((*session)
                ->Attend(kSmallModel, {inputs[0], {1, kSmallWidth}}, {},
                         [](absl::StatusOr<ac::AttendResult>) {})
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ClientTest, ASessionEndedByTheServerCompletesEachRequestOnceAndRefusesMore) {
  StartWith();
  const std::vector<float> input = TestValues(2 * kSmallWidth, 9);
  absl::StatusOr<std::unique_ptr<ac::AttendSession>> session = client().OpenSession(4);
  ASSERT_TRUE(session.ok()) << session.status();
  std::promise<absl::StatusOr<ac::AttendResult>> answered;
  ASSERT_TRUE((*session)
                  ->Attend(kSmallModel, {input, {2, kSmallWidth}}, {},
                           [&answered](absl::StatusOr<ac::AttendResult> result) {
                             answered.set_value(std::move(result));
                           })
                  .ok());
  std::future<absl::StatusOr<ac::AttendResult>> answer = answered.get_future();
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const absl::StatusOr<ac::AttendResult> first = answer.get();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->request_id, "s1");  // The session's own id.
  EXPECT_GT(first->request_bytes, 0);

  StopServer();
  // Either Attend finds the stream ended, or it is taken and its callback gets an error, once.
  std::atomic<int> calls{0};
  absl::StatusOr<ac::AttendResult> second;
  const absl::Status sent = (*session)->Attend(kSmallModel, {input, {2, kSmallWidth}}, {},
                                               [&](absl::StatusOr<ac::AttendResult> result) {
                                                 second = std::move(result);
                                                 ++calls;
                                               });
  (void)(*session)->Close();  // Returns once every callback has run.
  if (sent.ok()) {
    EXPECT_EQ(calls.load(), 1);
    EXPECT_FALSE(second.ok());
  } else {
    EXPECT_EQ(sent.code(), absl::StatusCode::kFailedPrecondition) << sent;
    EXPECT_EQ(calls.load(), 0);
  }
  EXPECT_EQ((*session)
                ->Attend(kSmallModel, {input, {2, kSmallWidth}}, {},
                         [&](absl::StatusOr<ac::AttendResult>) { ++calls; })
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_LE(calls.load(), 1);
}

TEST_F(ClientTest, ErrorsKeepTheServersCodeAndMessage) {
  StartWith();
  const std::vector<float> input = TestValues(2 * kSmallWidth, 4);
  absl::StatusOr<ac::AttendResult> unknown = client().Attend("nope", {input, {2, kSmallWidth}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("nope"));
  EXPECT_THAT(unknown.status().message(), HasSubstr(kSmallModel));  // Lists the serving models.

  absl::StatusOr<ac::AttendResult> narrow =
      client().Attend(kSmallModel, {std::span(input).first(2 * 15), {2, 15}});
  EXPECT_EQ(narrow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(narrow.status().message(), HasSubstr("input.shape[1]: expected d_model 16"));

  // Checked before sending: the data does not fill the shape.
  absl::StatusOr<ac::AttendResult> short_data =
      client().Attend(kSmallModel, {input, {3, kSmallWidth}});
  EXPECT_EQ(short_data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_data.status().message(), HasSubstr("input: the shape holds 48 elements"));
}

TEST_F(ClientTest, ACallPastItsDeadlineIsDeadlineExceeded) {
  server::ServerOptions options = TestServerOptions();
  options.model_limits.batching.max_queue_delay_us =
      60'000'000;  // Batches wait for a second request.
  options.model_limits.batching.max_batch_sequences = 2;
  StartWith(options, {.max_attempts = 1});
  const std::vector<float> input = TestValues(2 * kSmallWidth, 5);
  absl::StatusOr<ac::AttendResult> late = client().Attend(
      kSmallModel, {input, {2, kSmallWidth}}, {.deadline = std::chrono::milliseconds(200)});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
}

TEST_F(ClientTest, HealthAndModelCalls) {
  StartWith();
  EXPECT_TRUE(client().Health().ok());
  EXPECT_TRUE(client().Health(kSmallModel).ok());
  EXPECT_EQ(client().Health("nope").code(), absl::StatusCode::kNotFound);

  absl::StatusOr<std::vector<ac::ModelInfo>> models = client().ListModels();
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 2u);
  EXPECT_EQ((*models)[0].name, kSingleModel);
  EXPECT_EQ((*models)[1].name, kSmallModel);
  absl::StatusOr<ac::ModelInfo> small = client().GetModel(kSmallModel);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->d_model, kSmallWidth);
  EXPECT_EQ(small->num_heads, kSmallHeads);
  EXPECT_EQ(small->variant, "multi_head");
  EXPECT_EQ(small->version, 1);
  EXPECT_GT(small->batching.max_batch_sequences, 0);
  EXPECT_EQ(client().GetModel("nope").status().code(), absl::StatusCode::kNotFound);

  StopServer();  // A drained, stopped server: nothing answers.
  EXPECT_EQ(client().Health().code(), absl::StatusCode::kUnavailable);
}

TEST(ClientOptionsTest, BadOptionsAreRefusedNamingTheOption) {
  const auto refused = [](const ac::ClientOptions& options, const char* name) {
    absl::StatusOr<std::unique_ptr<ac::Client>> client = ac::Client::Create("127.0.0.1:1", options);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(client.status().message(), HasSubstr(name));
  };
  refused({.max_attempts = 0}, "max_attempts");
  refused({.max_attempts = 6}, "max_attempts");
  refused({.initial_backoff = std::chrono::milliseconds(0)}, "initial_backoff");
  refused({.backoff_multiplier = 0.5}, "backoff_multiplier");
  refused({.max_message_bytes = 10}, "max_message_bytes");
  refused({.load_balancing_policy = "random"}, "load_balancing_policy");
  EXPECT_EQ(ac::Client::Create("").status().code(), absl::StatusCode::kInvalidArgument);
}

// InferClient: the Open Inference Protocol's ModelInfer through the same server and channel
// settings; the answer equals Attend's bit for bit, its timing parameters come through, and a
// bad request keeps the server's code and message.
TEST_F(ClientTest, InferClientModelInferEqualsAttend) {
  StartWith();
  absl::StatusOr<std::unique_ptr<ac::InferClient>> infer =
      ac::InferClient::Create(absl::StrCat("127.0.0.1:", server().port()));
  ASSERT_TRUE(infer.ok()) << infer.status();
  const std::vector<float> input = TestValues(5 * kSmallWidth, 4);
  absl::StatusOr<ac::AttendResult> attended =
      client().Attend(kSmallModel, {input, {5, kSmallWidth}}, {.mask = ac::Mask::kCausal});
  ASSERT_TRUE(attended.ok()) << attended.status();
  absl::StatusOr<ac::InferResult> inferred = (*infer)->Infer(
      kSmallModel, {input, {5, kSmallWidth}}, {.mask = ac::Mask::kCausal, .id = "i1"});
  ASSERT_TRUE(inferred.ok()) << inferred.status();
  EXPECT_EQ(inferred->output.shape, (std::vector<int64_t>{5, kSmallWidth}));
  EXPECT_EQ(inferred->output.data, attended->output.data);
  EXPECT_EQ(inferred->model, kSmallModel);
  EXPECT_EQ(inferred->model_version, "1");
  EXPECT_EQ(inferred->id, "i1");
  ASSERT_TRUE(inferred->timing.batch_sequences.has_value());
  EXPECT_GE(*inferred->timing.batch_sequences, 1);
  EXPECT_TRUE(inferred->timing.queue_us.has_value());
  EXPECT_TRUE(inferred->timing.compute_us.has_value());
  EXPECT_GT(inferred->latency.count(), 0);

  Notification called;
  absl::StatusOr<ac::InferResult> wrong_width;
  (*infer)->InferAsync(kSmallModel, {input, {5 * kSmallWidth / 2, 2}}, {},
                       [&](absl::StatusOr<ac::InferResult> result) {
                         wrong_width = std::move(result);
                         called.Notify();
                       });
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(wrong_width.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_width.status().message(), HasSubstr("input"));

  absl::StatusOr<ac::InferResult> short_data =
      (*infer)->Infer(kSmallModel, {input, {6, kSmallWidth}});
  EXPECT_EQ(short_data.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve::testing
