// FillAttendResponse pads answers back with zeros in values or raw form and echoes the request;
// FillModelInfo and ToGrpcStatus.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attnserve/v1/attention.pb.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
#include "core/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/conversion/grpc_status.h"
#include "server/runtime/attend_work.h"
#include "tests/server/conversion/conversion_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
namespace v1 = ::attnserve::v1;
using server::AttendResult;
using server::AttendWork;

// FillAttendResponse.

std::vector<float> Floats(const v1::Tensor& tensor) {
  return tensor.raw().empty() ? std::vector<float>(tensor.values().begin(), tensor.values().end())
                              : RawFloats(tensor);
}

TEST(FillAttendResponseTest, Rank3PadsOutputAndWeightsWithZeros) {
  const absl::StatusOr<AttendWork> work = Parse(Rank3Request());
  ASSERT_TRUE(work.ok()) << work.status();
  const AttendResult result = ResultFor(*work);
  v1::AttendResponse response;
  ASSERT_TRUE(server::FillAttendResponse(*work, result, &response).ok());

  EXPECT_THAT(response.output().shape(), ElementsAre(2, 3, kD));
  EXPECT_TRUE(response.output().raw().empty());
  std::vector<float> output(2 * 3 * kD, 0.0f);  // sequence 1's row 2 is padding
  std::copy(result.output.begin(), result.output.begin() + 5 * kD, output.begin());
  EXPECT_THAT(Floats(response.output()), ElementsAreArray(output));

  // [B, h, T, S] = [2, 2, 3, 4]; sequence 0 is [h, 3, 4] full, sequence 1 [h, 2, 1].
  EXPECT_THAT(response.weights().shape(), ElementsAre(2, kHeads, 3, 4));
  std::vector<float> weights(2 * kHeads * 3 * 4, 0.0f);
  auto source = result.weights.begin();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t head = 0; head < kHeads; ++head) {
      for (int64_t t = 0; t < work->query_lengths[b]; ++t) {
        for (int64_t s = 0; s < work->memory_lengths[b]; ++s) {
          weights[((b * kHeads + head) * 3 + t) * 4 + s] = *source++;
        }
      }
    }
  }
  EXPECT_EQ(source, result.weights.end());
  EXPECT_THAT(Floats(response.weights()), ElementsAreArray(weights));
}

TEST(FillAttendResponseTest, Rank2WeightsAreHeadsByTByS) {
  v1::AttendRequest request = Rank2Request();
  request.set_return_weights(true);
  request.add_lengths(2);
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  const AttendResult result = ResultFor(*work);
  v1::AttendResponse response;
  ASSERT_TRUE(server::FillAttendResponse(*work, result, &response).ok());
  EXPECT_THAT(response.output().shape(), ElementsAre(3, kD));
  EXPECT_THAT(response.weights().shape(), ElementsAre(kHeads, 3, 3));
  const std::vector<float> weights = Floats(response.weights());
  // Head 1, row 1: its 2 valid keys, then a zero padding key; row 2 is padding.
  EXPECT_THAT(std::vector<float>(weights.begin() + 12, weights.begin() + 18),
              ElementsAre(result.weights[6], result.weights[7], 0, 0, 0, 0));
}

TEST(FillAttendResponseTest, RawAndValuesCarryTheSameBits) {
  v1::AttendRequest request = Rank3Request();
  std::vector<float> values = Sequential(2 * 3 * kD, -7.25f);
  values[0] = -0.0f;
  values[1] = std::numeric_limits<float>::denorm_min();
  values[2] = 0.1f;
  SetTensor(request.mutable_input(), {2, 3, kD}, values, /*raw=*/true);
  v1::AttendResponse responses[2];
  for (bool raw : {false, true}) {
    request.set_raw_output(raw);
    const absl::StatusOr<AttendWork> work = Parse(request);
    ASSERT_TRUE(work.ok()) << work.status();
    AttendResult result = ResultFor(*work);
    result.output = work->query;  // echo: input in, same bits out (padding zeroed)
    ASSERT_TRUE(server::FillAttendResponse(*work, result, &responses[raw]).ok());
    EXPECT_EQ(responses[raw].output().values().empty(), raw);
    EXPECT_EQ(responses[raw].output().raw().empty(), !raw);
    EXPECT_EQ(responses[raw].weights().values().empty(), raw);
  }
  std::vector<float> expected = values;
  std::fill(expected.begin() + 5 * kD, expected.end(), 0.0f);  // sequence 1's row 2
  EXPECT_THAT(Bits(Floats(responses[0].output())), ElementsAreArray(Bits(expected)));
  EXPECT_THAT(Bits(Floats(responses[1].output())), ElementsAreArray(Bits(expected)));
  EXPECT_THAT(Bits(Floats(responses[0].weights())),
              ElementsAreArray(Bits(Floats(responses[1].weights()))));
}

TEST(FillAttendResponseTest, SixteenBitRawOutputIsRoundedAndPadded) {
  for (v1::DataType dtype : {v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP16}) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    v1::AttendRequest request = Rank3Request();
    request.set_raw_output(true);
    request.set_raw_output_dtype(dtype);
    const absl::StatusOr<AttendWork> work = Parse(request);
    ASSERT_TRUE(work.ok()) << work.status();
    AttendResult result = ResultFor(*work);  // Small integers + 0.5: exact in both formats.
    v1::AttendResponse response;
    ASSERT_TRUE(server::FillAttendResponse(*work, result, &response).ok());
    EXPECT_EQ(response.output().dtype(), dtype);
    EXPECT_EQ(response.weights().dtype(), dtype);
    EXPECT_TRUE(response.output().values().empty());
    EXPECT_EQ(response.output().raw().size(), 2u * 3 * kD * 2);  // [2, 3, 8], 2 bytes each
    EXPECT_EQ(response.weights().raw().size(), 2u * kHeads * 3 * 4 * 2);
    std::vector<float> output(2 * 3 * kD, 0.0f);
    std::copy(result.output.begin(), result.output.begin() + 5 * kD, output.begin());
    EXPECT_THAT(RawFloats(response.output()), ElementsAreArray(output));
    EXPECT_EQ(RawFloats(response.weights())[0], result.weights[0]);
  }
}

TEST(FillAttendResponseTest, SixteenBitRawOutputRoundsToNearest) {
  v1::AttendRequest request = Rank2Request();
  request.set_raw_output(true);
  std::vector<float> output = Sequential(3 * kD, 0.5f);
  output[0] = 1.0f + 1.0f / 256;  // The tie between bf16's 1 and 1 + 2^-7: to even, 1.
  output[1] = 1.0f + 3.0f / 256;  // The tie between 1 + 2^-7 and 1 + 2^-6: to even, 1 + 2^-6.
  output[2] = 70000.0f;           // Beyond binary16: +inf; bf16: 70144 (step 512).
  output[3] = 1e-8f;              // Binary16: 2^-27 is below half its smallest subnormal: 0.
  const std::vector<float> expected_bf16 = {1.0f, 1.0f + 1.0f / 64, 70144.0f,
                                            std::bit_cast<float>(0x322c0000u)};
  const std::vector<float> expected_fp16 = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256,
                                            std::numeric_limits<float>::infinity(), 0.0f};
  for (v1::DataType dtype : {v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP16}) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    request.set_raw_output_dtype(dtype);
    const absl::StatusOr<AttendWork> work = Parse(request);
    ASSERT_TRUE(work.ok()) << work.status();
    AttendResult result = ResultFor(*work);
    result.output = output;
    v1::AttendResponse response;
    ASSERT_TRUE(server::FillAttendResponse(*work, result, &response).ok());
    const std::vector<float> got = RawFloats(response.output());
    EXPECT_THAT(std::vector<float>(got.begin(), got.begin() + 4),
                ElementsAreArray(dtype == v1::DATA_TYPE_BF16 ? expected_bf16 : expected_fp16));
  }
}

TEST(FillAttendResponseTest, EchoesModelRequestIdAndTiming) {
  v1::AttendRequest request = Rank3Request();
  request.set_request_id("req-42");
  request.set_return_weights(false);
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  AttendResult result = ResultFor(*work);
  result.timing.batch_tokens = int64_t{1} << 40;  // saturates the int32 field
  v1::AttendResponse response;
  SetSequential(response.mutable_weights(), {1, 1});  // stale content is cleared
  ASSERT_TRUE(server::FillAttendResponse(*work, result, &response).ok());
  EXPECT_EQ(response.model(), "tiny");
  EXPECT_EQ(response.model_version(), 3);
  EXPECT_EQ(response.request_id(), "req-42");
  EXPECT_FALSE(response.has_weights());
  EXPECT_EQ(response.timing().queue_us(), 11);
  EXPECT_EQ(response.timing().compute_us(), 22);
  EXPECT_EQ(response.timing().batch_sequences(), 5);
  EXPECT_EQ(response.timing().batch_tokens(), std::numeric_limits<int32_t>::max());
}

TEST(FillAttendResponseTest, MismatchedResultIsInternalAndLeavesResponseAlone) {
  const absl::StatusOr<AttendWork> work = Parse(Rank3Request());
  ASSERT_TRUE(work.ok()) << work.status();
  v1::AttendResponse response;
  response.set_request_id("untouched");
  AttendResult result = ResultFor(*work);
  result.output = result.output.first(result.output.size() - 1);
  EXPECT_EQ(server::FillAttendResponse(*work, result, &response).code(),
            absl::StatusCode::kInternal);
  result = ResultFor(*work);
  result.weights = {};
  EXPECT_EQ(server::FillAttendResponse(*work, result, &response).code(),
            absl::StatusCode::kInternal);
  AttendWork broken = *work;
  broken.query_lengths[0] = 4;  // past padded_query_length
  EXPECT_EQ(server::FillAttendResponse(broken, ResultFor(*work), &response).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(response.request_id(), "untouched");
  EXPECT_FALSE(response.has_output());
}

// ---------------------------------------------------------------------------------------------
// FillModelInfo, FillDecodeSessions and ToGrpcStatus.

TEST(FillModelInfoTest, DescribesModelAndLimits) {
  const server::ModelLimits limits{
      .batching = {.max_batch_sequences = 16,
                   .max_batch_tokens = 2048,
                   .max_queue_delay_us = 250,
                   .max_queue_size = 99,
                   .max_queued_bytes = 12345},
      .request = {.max_sequence_length = 1024, .max_response_bytes = 1 << 20}};
  v1::ModelInfo info;
  info.set_name("stale");
  server::FillModelInfo(*TinyModel(), limits, /*is_default=*/true, &info);
  EXPECT_EQ(info.name(), "tiny");
  EXPECT_EQ(info.d_model(), kD);
  EXPECT_EQ(info.num_heads(), kHeads);
  EXPECT_EQ(info.variant(), "multi_head");
  EXPECT_TRUE(info.bias());
  EXPECT_EQ(info.dtype(), "fp32");
  EXPECT_EQ(info.parameter_count(), 4 * kD * kD + 4 * kD);
  EXPECT_EQ(info.batching().max_batch_sequences(), 16);
  EXPECT_EQ(info.batching().max_batch_tokens(), 2048);
  EXPECT_EQ(info.batching().max_queue_delay_us(), 250);
  EXPECT_EQ(info.batching().max_queue_size(), 99);
  EXPECT_EQ(info.batching().max_queued_bytes(), 12345);
  EXPECT_EQ(info.max_sequence_length(), 1024);
  EXPECT_EQ(info.version(), 3);
  EXPECT_EQ(info.source(), "embedded");
  EXPECT_TRUE(info.is_default());
  EXPECT_EQ(info.kv_cache_dtype(), "fp32");
  server::FillModelInfo(*TinyModel(), limits, /*is_default=*/false, &info);
  EXPECT_FALSE(info.is_default());
  model::Model int8_cache = *TinyModel();
  int8_cache.config.kv_cache_dtype = model::KvCacheDtype::kInt8;
  server::FillModelInfo(int8_cache, limits, /*is_default=*/false, &info);
  EXPECT_EQ(info.kv_cache_dtype(), "int8");
  EXPECT_EQ(info.dtype(), "fp32");
}

TEST(FillModelInfoTest, DecodeSessionsOfTheServingAndOfRetiredVersions) {
  v1::ModelInfo info;
  server::FillModelInfo(*TinyModel(), {}, false, &info);  // "tiny" version 3 serves.
  // After two reloads, sessions still hold versions 1 and 3; version 2's ended.
  server::FillDecodeSessions(
      {{{"other", 1}, 5}, {{"tiny", 1}, 2}, {{"tiny", 2}, 0}, {{"tiny", 3}, 4}, {{"tinyx", 1}, 7}},
      &info);
  EXPECT_EQ(info.decode_sessions(), 4);
  ASSERT_EQ(info.retired_versions_size(), 1);
  EXPECT_EQ(info.retired_versions(0).version(), 1);
  EXPECT_EQ(info.retired_versions(0).decode_sessions(), 2);
  // Every session ended: nothing retired is listed any more.
  server::FillDecodeSessions({{{"other", 1}, 5}}, &info);
  EXPECT_EQ(info.decode_sessions(), 0);
  EXPECT_EQ(info.retired_versions_size(), 0);
}

TEST(FillModelInfoTest, SingleHeadVariantName) {
  auto single = std::make_shared<model::Model>(*TinyModel());
  single->config.attention.variant = core::AttentionVariant::kSingleHead;
  single->config.attention.num_heads = 1;
  v1::ModelInfo info;
  server::FillModelInfo(*single, {}, false, &info);
  EXPECT_EQ(info.variant(), "single_head");
  EXPECT_EQ(info.num_heads(), 1);
  EXPECT_EQ(info.parameter_count(), 3 * kD * kD + 3 * kD);
}

TEST(ToGrpcStatusTest, KeepsEveryCodeNumberAndTheMessage) {
  EXPECT_TRUE(server::ToGrpcStatus(absl::OkStatus()).ok());
  const std::pair<absl::StatusCode, grpc::StatusCode> codes[] = {
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [absl_code, grpc_code] : codes) {
    const std::string message = absl::StrCat("message for ", absl::StatusCodeToString(absl_code));
    const grpc::Status status = server::ToGrpcStatus(absl::Status(absl_code, message));
    EXPECT_EQ(status.error_code(), grpc_code) << message;
    EXPECT_EQ(status.error_message(), message);
  }
}

// The backstop for every protocol: a status message is at most kMaxStatusMessageBytes (plus the
// size note), cut on a character boundary.
TEST(ToGrpcStatusTest, CutsALongMessage) {
  const std::string message = "model: " + std::string(100'000, 'x');
  const grpc::Status status = server::ToGrpcStatus(absl::NotFoundError(message));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(),
            message.substr(0, server::kMaxStatusMessageBytes) + "...(100007 bytes)");
  const std::string fits(server::kMaxStatusMessageBytes, 'y');
  EXPECT_EQ(server::ToGrpcStatus(absl::InternalError(fits)).error_message(), fits);
}

TEST(ToGrpcStatusTest, CodeOutsideGrpcRangeIsUnknown) {
  const grpc::Status status =
      server::ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(status.error_message(), "odd");
}

}  // namespace
}  // namespace attnserve::testing
