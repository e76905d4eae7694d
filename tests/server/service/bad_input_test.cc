// Bad unary Attend requests over the real gRPC wire: each is refused with the right gRPC code and a
// message naming the field, what was expected and what was received, and the same server keeps
// answering good requests correctly after every one of them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kMaxSequenceLength = 32;
constexpr int64_t kMaxBatchSequences = 4;
constexpr int64_t kMaxMessageBytes = int64_t{64} << 10;

// A good request: one [5, 16] sequence for "small".
constexpr int64_t kGoodLength = 5;
constexpr uint64_t kGoodSeed = 77;

struct BadCase {
  std::string name;
  std::function<v1::AttendRequest()> make;
  grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
  // Each must appear in the error message: the field, the expected and the received value.
  std::vector<std::string> substrings = {};
};

v1::AttendRequest Small(int64_t length, uint64_t seed = 1) {
  return MakeRequest(kSmallModel, length, kSmallWidth, seed);
}

v1::AttendRequest WithShape(v1::AttendRequest request, const std::vector<int64_t>& shape) {
  request.mutable_input()->clear_shape();
  for (int64_t dim : shape) request.mutable_input()->add_shape(dim);
  return request;
}

// `request` with `count` input values (or raw floats) from a fixed seed, replacing its data.
v1::AttendRequest WithValues(v1::AttendRequest request, int64_t count, bool raw = false) {
  const std::vector<float> values = TestValues(static_cast<size_t>(count), 9);
  request.mutable_input()->clear_values();
  request.mutable_input()->clear_raw();
  if (raw) {
    SetRaw(values, request.mutable_input());
  } else {
    request.mutable_input()->mutable_values()->Add(values.begin(), values.end());
  }
  return request;
}

v1::AttendRequest WithMemory(v1::AttendRequest request, int64_t length, int64_t width) {
  request.mutable_memory()->add_shape(length);
  request.mutable_memory()->add_shape(width);
  const std::vector<float> values = TestValues(static_cast<size_t>(length * width), 5);
  request.mutable_memory()->mutable_values()->Add(values.begin(), values.end());
  return request;
}

std::vector<BadCase> BadCases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<BadCase> cases;
  cases.push_back({.name = "unknown model",
                   .make = [] { return MakeRequest("nope", 3, kSmallWidth, 1); },
                   .code = grpc::StatusCode::NOT_FOUND,
                   .substrings = {"model", "\"nope\"", kSingleModel, kSmallModel}});
  // Quoted whole, an 8,000-character name would overflow the client's 8 KiB metadata limit and
  // turn NOT_FOUND into RESOURCE_EXHAUSTED: the message quotes its first 128 bytes.
  cases.push_back(
      {.name = "unknown model with a huge name",
       .make = [] { return MakeRequest(std::string(8000, 'x'), 3, kSmallWidth, 1); },
       .code = grpc::StatusCode::NOT_FOUND,
       .substrings = {"model", std::string(128, 'x') + "...(8000 bytes)\"", kSmallModel}});
  cases.push_back(
      {.name = "no default model among two, none named demo",
       .make = [] { return MakeRequest("", 3, kSmallWidth, 1); },
       .code = grpc::StatusCode::NOT_FOUND,
       .substrings = {"model: no default model", "demo", kSingleModel, kSmallModel, "got \"\""}});
  cases.push_back({.name = "wrong last dim",
                   .make = [] { return MakeRequest(kSmallModel, 5, 12, 1); },
                   .substrings = {"input.shape[1]", "expected d_model 16", "\"small\"", "got 12"}});
  cases.push_back({.name = "wrong last dim, single-head model",
                   .make = [] { return MakeRequest(kSingleModel, 3, kSmallWidth, 1); },
                   .substrings = {"input.shape[1]", "expected d_model 8", "\"single\"", "got 16"}});
  cases.push_back({.name = "wrong last dim, rank 3",
                   .make =
                       [] {
                         return MakeBatchedRequest(kSmallModel, {2, 3}, 17, 1);
                       },
                   .substrings = {"input.shape[2]", "expected d_model 16", "got 17"}});
  cases.push_back({.name = "rank 1",
                   .make = [] { return WithShape(Small(1), {kSmallWidth}); },
                   .substrings = {"input.shape", "expected rank 2", "got rank 1 [16]"}});
  cases.push_back(
      {.name = "rank 4",
       .make =
           [] {
             return WithShape(Small(5), {1, 1, 5, kSmallWidth});
           },
       .substrings = {"input.shape", "expected rank 2", "or 3", "got rank 4 [1, 1, 5, 16]"}});
  cases.push_back({.name = "no input",
                   .make =
                       [] {
                         v1::AttendRequest request;
                         request.set_model(kSmallModel);
                         return request;
                       },
                   .substrings = {"input", "expected a [T, d_model]", "got none"}});
  cases.push_back({.name = "values count below the shape's",
                   .make = [] { return WithValues(Small(5), 5 * kSmallWidth - 1); },
                   .substrings = {"input.values", "expected 80 elements", "[5, 16]", "got 79"}});
  cases.push_back({.name = "values count above the shape's",
                   .make = [] { return WithValues(Small(5), 6 * kSmallWidth); },
                   .substrings = {"input.values", "expected 80 elements", "got 96"}});
  cases.push_back({.name = "raw count mismatch",
                   .make = [] { return WithValues(Small(5), 4 * kSmallWidth, /*raw=*/true); },
                   .substrings = {"input.raw", "expected 320 bytes (80 DATA_TYPE_FP32 elements",
                                  "got 256 bytes"}});
  cases.push_back(
      {.name = "bf16 raw holding float32 bytes",
       .make =
           [] {
             v1::AttendRequest request = WithValues(Small(5), 5 * kSmallWidth, /*raw=*/true);
             request.mutable_input()->set_dtype(v1::DATA_TYPE_BF16);
             return request;
           },
       .substrings = {"input.raw",
                      "expected 160 bytes (80 DATA_TYPE_BF16 elements of shape [5, 16], 2 bytes "
                      "each)",
                      "got 320 bytes"}});
  cases.push_back(
      {.name = "unknown dtype",
       .make =
           [] {
             v1::AttendRequest request = WithValues(Small(5), 5 * kSmallWidth, /*raw=*/true);
             request.mutable_input()->set_dtype(static_cast<v1::DataType>(5));
             return request;
           },
       .substrings = {"input.dtype", "expected DATA_TYPE_FP32 (0), DATA_TYPE_BF16 (1)", "got 5"}});
  cases.push_back({.name = "both values and raw",
                   .make =
                       [] {
                         v1::AttendRequest request = Small(5);
                         request.mutable_input()->set_raw(std::string(5 * kSmallWidth * 4, '\0'));
                         return request;
                       },
                   .substrings = {"input", "expected exactly one of values or raw",
                                  "got both (80 values and 320 raw bytes)"}});
  cases.push_back(
      {.name = "neither values nor raw",
       .make =
           [] {
             v1::AttendRequest request = Small(5);
             request.mutable_input()->clear_values();
             return request;
           },
       .substrings = {"input", "expected exactly one of values or raw", "got neither"}});
  cases.push_back({.name = "raw bytes one past the shape's",
                   .make =
                       [] {
                         v1::AttendRequest request = Small(5);
                         request.mutable_input()->clear_values();
                         request.mutable_input()->set_raw(std::string(321, '\0'));
                         return request;
                       },
                   .substrings = {"input.raw", "expected 320 bytes", "got 321 bytes"}});
  cases.push_back({.name = "zero dim",
                   .make =
                       [] {
                         return WithShape(Small(1), {0, kSmallWidth});
                       },
                   .substrings = {"input.shape[0]", "expected > 0", "got 0"}});
  cases.push_back({.name = "negative dim",
                   .make =
                       [] {
                         return WithShape(Small(3), {2, -3, kSmallWidth});
                       },
                   .substrings = {"input.shape[1]", "expected > 0", "got -3"}});
  cases.push_back(
      {.name = "lengths wrong count",
       .make =
           [] {
             v1::AttendRequest request = MakeBatchedRequest(kSmallModel, {3, 5}, kSmallWidth, 1);
             request.add_lengths(2);
             return request;
           },
       .substrings = {"lengths", "expected 2 entries", "got 3"}});
  cases.push_back(
      {.name = "lengths 0",
       .make =
           [] {
             v1::AttendRequest request = MakeBatchedRequest(kSmallModel, {3, 5}, kSmallWidth, 1);
             request.set_lengths(0, 0);
             return request;
           },
       .substrings = {"lengths[0]", "expected 1..5", "got 0"}});
  cases.push_back(
      {.name = "lengths above T",
       .make =
           [] {
             v1::AttendRequest request = MakeBatchedRequest(kSmallModel, {3, 5}, kSmallWidth, 1);
             request.set_lengths(1, 6);
             return request;
           },
       .substrings = {"lengths[1]", "expected 1..5", "got 6"}});
  cases.push_back({.name = "memory last dim wrong",
                   .make = [] { return WithMemory(Small(4), 6, 12); },
                   .substrings = {"memory.shape[1]", "expected d_model 16", "got 12"}});
  cases.push_back(
      {.name = "memory_lengths without memory",
       .make =
           [] {
             v1::AttendRequest request = Small(4);
             request.add_memory_lengths(4);
             return request;
           },
       .substrings = {"memory_lengths", "expected none without memory", "got 1 entries"}});
  cases.push_back({.name = "memory_lengths above S",
                   .make =
                       [] {
                         v1::AttendRequest request = WithMemory(Small(4), 6, kSmallWidth);
                         request.add_memory_lengths(7);
                         return request;
                       },
                   .substrings = {"memory_lengths[0]", "expected 1..6", "got 7"}});
  cases.push_back({.name = "unknown mask enum value",
                   .make =
                       [] {
                         v1::AttendRequest request = Small(4);
                         request.set_mask(static_cast<v1::MaskKind>(9));
                         return request;
                       },
                   .substrings = {"mask", "expected MASK_NONE (0) or MASK_CAUSAL (1)", "got 9"}});
  cases.push_back({.name = "attn_mask wrong shape",
                   .make =
                       [] {
                         v1::AttendRequest request = Small(5);
                         request.mutable_attn_mask()->add_shape(5);
                         request.mutable_attn_mask()->add_shape(4);
                         for (int i = 0; i < 20; ++i) request.mutable_attn_mask()->add_values(1);
                         return request;
                       },
                   .substrings = {"attn_mask.shape[1]", "expected 5", "got 4"}});
  cases.push_back({.name = "attn_mask wrong rank",
                   .make =
                       [] {
                         v1::AttendRequest request = Small(5);
                         request.mutable_attn_mask()->add_shape(25);
                         for (int i = 0; i < 25; ++i) request.mutable_attn_mask()->add_values(1);
                         return request;
                       },
                   .substrings = {"attn_mask.shape", "expected rank 2", "got rank 1 [25]"}});
  cases.push_back({.name = "head_mask wrong length",
                   .make =
                       [] {
                         v1::AttendRequest request = Small(4);
                         for (int i = 0; i < 3; ++i) request.add_head_mask(true);
                         return request;
                       },
                   .substrings = {"head_mask", "expected none or 2 entries", "got 3"}});
  cases.push_back({.name = "NaN input",
                   .make =
                       [nan] {
                         v1::AttendRequest request = Small(5);
                         request.mutable_input()->set_values(2 * kSmallWidth + 7, nan);
                         return request;
                       },
                   .substrings = {"input[2, 7]", "expected a finite value", "got nan"}});
  cases.push_back(
      {.name = "+inf input, batched and raw",
       .make =
           [inf] {
             v1::AttendRequest request = MakeBatchedRequest(kSmallModel, {4, 3}, kSmallWidth, 1);
             std::vector<float> values = TensorValues(request.input());
             values[(1 * 4 + 2) * kSmallWidth + 3] = inf;
             SetRaw(values, request.mutable_input());
             return request;
           },
       .substrings = {"input[1, 2, 3]", "expected a finite value", "got inf"}});
  cases.push_back({.name = "-inf memory",
                   .make =
                       [inf] {
                         v1::AttendRequest request = WithMemory(Small(4), 6, kSmallWidth);
                         request.mutable_memory()->set_values(5 * kSmallWidth, -inf);
                         return request;
                       },
                   .substrings = {"memory[5, 0]", "expected a finite value", "got -inf"}});
  cases.push_back(
      {.name = "sequence longer than max_sequence_length",
       .make = [] { return Small(kMaxSequenceLength + 1); },
       .substrings = {"input.shape[0]", "max_sequence_length 32", "\"small\"", "got 33"}});
  cases.push_back({.name = "memory longer than max_sequence_length",
                   .make = [] { return WithMemory(Small(4), kMaxSequenceLength + 8, kSmallWidth); },
                   .substrings = {"memory.shape[0]", "max_sequence_length 32", "got 40"}});
  cases.push_back({.name = "too many sequences",
                   .make =
                       [] {
                         return MakeBatchedRequest(kSmallModel, {1, 1, 1, 1, 1}, kSmallWidth, 1);
                       },
                   .substrings = {"input.shape[0]", "max_batch_sequences 4", "got 5"}});
  cases.push_back({.name = "larger than max_message_bytes",
                   // 32 sequences of [32, 16] floats: 64 KiB of values plus framing.
                   .make =
                       [] {
                         return MakeBatchedRequest(kSmallModel,
                                                   std::vector<int64_t>(32, kMaxSequenceLength),
                                                   kSmallWidth, 1);
                       },
                   .code = grpc::StatusCode::RESOURCE_EXHAUSTED,
                   .substrings = {"larger than max", "65536"}});
  return cases;
}

class BadInputTest : public ServerTest {
 protected:
  void SetUp() override {
    server::ServerOptions options = TestServerOptions();
    options.model_limits.request.max_sequence_length = kMaxSequenceLength;
    options.model_limits.batching.max_batch_sequences = kMaxBatchSequences;
    options.max_message_bytes = kMaxMessageBytes;
    StartServer(options);
  }

  // Sends the good request and checks it is answered with the core's output.
  void ExpectGoodRequestAnswered(const std::vector<float>& expected) {
    v1::AttendRequest request = Small(kGoodLength, kGoodSeed);
    request.set_request_id("good");
    v1::AttendResponse response;
    const grpc::Status status = Attend(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
    EXPECT_EQ(response.request_id(), "good");
    EXPECT_EQ(response.model(), kSmallModel);
    EXPECT_THAT(TensorShape(response.output()), ElementsAre(kGoodLength, kSmallWidth));
    EXPECT_TRUE(Near(TensorValues(response.output()), expected));
  }
};

TEST_F(BadInputTest, EveryBadRequestIsRefusedNamingTheFieldAndTheServerGoesOn) {
  const std::vector<float> expected =
      CoreCompute(*Layer(kSmallModel), {.query = TestValues(kGoodLength * kSmallWidth, kGoodSeed)})
          .output;
  ASSERT_EQ(expected.size(), static_cast<size_t>(kGoodLength * kSmallWidth));
  for (const BadCase& bad : BadCases()) {
    SCOPED_TRACE(bad.name);
    v1::AttendRequest request = bad.make();
    request.set_request_id("bad");
    v1::AttendResponse response;
    const grpc::Status status = Attend(request, &response);
    EXPECT_EQ(status.error_code(), bad.code) << status.error_message();
    for (const std::string& piece : bad.substrings) {
      EXPECT_THAT(status.error_message(), HasSubstr(piece));
    }
    if (bad.code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // gRPC's own refusal names the received and the allowed size.
      EXPECT_THAT(status.error_message(),
                  HasSubstr(absl::StrCat("(", request.ByteSizeLong(), " vs. ", kMaxMessageBytes)));
    }
    EXPECT_FALSE(response.has_output());
    ExpectGoodRequestAnswered(expected);
  }
}

TEST_F(BadInputTest, TheLimitsInForceAreTheOnesTheServerReports) {
  // The limits the bad cases rely on are the ones the server advertises.
  grpc::ClientContext context;
  v1::GetModelRequest get;
  get.set_name(kSmallModel);
  v1::ModelInfo info;
  ASSERT_TRUE(stub().GetModel(&context, get, &info).ok());
  EXPECT_EQ(info.max_sequence_length(), kMaxSequenceLength);
  EXPECT_EQ(info.batching().max_batch_sequences(), kMaxBatchSequences);
  EXPECT_FALSE(info.is_default());
}

TEST_F(BadInputTest, RequestsAtTheLimitsAreAccepted) {
  // The boundaries are inclusive: T = max_sequence_length and B = max_batch_sequences pass.
  const std::vector<int64_t> lengths(kMaxBatchSequences, kMaxSequenceLength);
  const v1::AttendRequest request = MakeBatchedRequest(kSmallModel, lengths, kSmallWidth, 3);
  v1::AttendResponse response;
  const grpc::Status status = Attend(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(TensorShape(response.output()),
              ElementsAre(kMaxBatchSequences, kMaxSequenceLength, kSmallWidth));
  const std::vector<float> input = TensorValues(request.input());
  const std::vector<float> output = TensorValues(response.output());
  const size_t block = kMaxSequenceLength * kSmallWidth;
  const CoreAnswer last = CoreCompute(
      *Layer(kSmallModel), {.query = std::vector<float>(input.end() - block, input.end())});
  EXPECT_TRUE(Near({output.end() - block, output.end()}, last.output));
}

}  // namespace
}  // namespace attnserve::testing
