// ParseAttendRequest on good requests: what lands in the AttendWork (rows packed without
// padding, raw bit-exact, masks per sequence, limits inclusive).
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
#include "core/util/float_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/runtime/attend_work.h"
#include "tests/server/conversion/conversion_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
namespace v1 = ::attnserve::v1;
using server::AttendWork;
using server::ModelLimits;

// Good requests: what lands in the AttendWork.

TEST(ParseAttendRequestTest, Rank2ValuesSelfAttentionTakesEveryRow) {
  v1::AttendRequest request = Rank2Request();
  request.clear_attn_mask();
  request.set_request_id("r-17");
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_EQ(work->model, TinyModel());
  EXPECT_FALSE(work->batched);
  EXPECT_THAT(work->query, ElementsAreArray(Sequential(3 * kD)));
  EXPECT_THAT(work->query_lengths, ElementsAre(3));
  EXPECT_FALSE(work->cross_attention);
  EXPECT_THAT(work->memory, IsEmpty());
  EXPECT_THAT(work->memory_lengths, IsEmpty());
  EXPECT_EQ(work->padded_query_length, 3);
  EXPECT_EQ(work->padded_memory_length, 3);
  EXPECT_FALSE(work->causal);
  EXPECT_THAT(work->explicit_mask, IsEmpty());
  EXPECT_THAT(work->head_mask, IsEmpty());
  EXPECT_FALSE(work->return_weights);
  EXPECT_FALSE(work->raw_output);
  EXPECT_EQ(work->request_id, "r-17");
  EXPECT_EQ(work->sequences(), 1);
  EXPECT_EQ(work->tokens(), 3);
}

TEST(ParseAttendRequestTest, Rank3LengthsDropPaddingRowsEvenNonFiniteOnes) {
  v1::AttendRequest request;
  std::vector<float> values = Sequential(2 * 4 * kD);
  values[(0 * 4 + 3) * kD + 1] = kNaN;  // padding of sequence 0 (length 2): ignored
  values[(1 * 4 + 3) * kD] = kInf;      // padding of sequence 1 (length 3): ignored
  SetTensor(request.mutable_input(), {2, 4, kD}, values);
  request.add_lengths(2);
  request.add_lengths(3);
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_TRUE(work->batched);
  std::vector<float> expected = Sequential(2 * kD);                  // [0, 0..1, :]
  for (float v : Sequential(3 * kD, 4 * kD)) expected.push_back(v);  // [1, 0..2, :]
  EXPECT_THAT(work->query, ElementsAreArray(expected));
  EXPECT_THAT(work->query_lengths, ElementsAre(2, 3));
  EXPECT_EQ(work->padded_query_length, 4);
  EXPECT_EQ(work->padded_memory_length, 4);
  EXPECT_EQ(work->tokens(), 5);
}

TEST(ParseAttendRequestTest, RawIsBitExactAndMatchesValues) {
  // Values whose bits a decimal detour could lose: -0, a denormal, the extremes.
  std::vector<float> values = Sequential(2 * 3 * kD, -20.5f);
  values[0] = -0.0f;
  values[1] = std::numeric_limits<float>::denorm_min();
  values[2] = std::numeric_limits<float>::max();
  values[3] = std::numeric_limits<float>::lowest();
  values[4] = 0.1f;
  v1::AttendRequest raw_request;
  SetTensor(raw_request.mutable_input(), {2, 3, kD}, values, /*raw=*/true);
  v1::AttendRequest values_request;
  SetTensor(values_request.mutable_input(), {2, 3, kD}, values);
  const absl::StatusOr<AttendWork> from_raw = Parse(raw_request);
  const absl::StatusOr<AttendWork> from_values = Parse(values_request);
  ASSERT_TRUE(from_raw.ok()) << from_raw.status();
  ASSERT_TRUE(from_values.ok()) << from_values.status();
  EXPECT_THAT(Bits(from_raw->query), ElementsAreArray(Bits(values)));
  EXPECT_THAT(Bits(from_values->query), ElementsAreArray(Bits(values)));
}

TEST(ParseAttendRequestTest, MemoryIsPackedPerSequence) {
  v1::AttendRequest request = Rank3Request();
  SetSequential(request.mutable_memory(), {2, 4, kD}, 1000.0f, /*raw=*/true);
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_TRUE(work->cross_attention);
  std::vector<float> expected = Sequential(4 * kD, 1000.0f);               // [0, 0..3, :]
  for (float v : Sequential(kD, 1000.0f + 4 * kD)) expected.push_back(v);  // [1, 0, :]
  EXPECT_THAT(work->memory, ElementsAreArray(expected));
  EXPECT_THAT(work->memory_lengths, ElementsAre(4, 1));
  EXPECT_EQ(work->padded_query_length, 3);
  EXPECT_EQ(work->padded_memory_length, 4);
}

TEST(ParseAttendRequestTest, MemoryWithoutMemoryLengthsIsFullLength) {
  v1::AttendRequest request = Rank3Request();
  request.clear_memory_lengths();
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_THAT(work->memory_lengths, ElementsAre(4, 4));
  EXPECT_THAT(work->memory, ElementsAreArray(Sequential(2 * 4 * kD, 1000.0f)));
}

TEST(ParseAttendRequestTest, FlagsAndHeadMaskAreCopied) {
  v1::AttendRequest request = Rank3Request();
  request.set_mask(v1::MASK_CAUSAL);
  request.set_raw_output(true);
  request.set_request_id("abc");
  request.set_head_mask(1, false);
  request.set_head_mask(0, true);
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_TRUE(work->causal);
  EXPECT_TRUE(work->raw_output);
  EXPECT_TRUE(work->return_weights);
  EXPECT_EQ(work->request_id, "abc");
  EXPECT_THAT(work->head_mask, ElementsAre(true, false));
}

TEST(ParseAttendRequestTest, AttnMaskIsPackedPerSequenceWithoutPadding) {
  // Cross-attention, T = 3, S = 4, lengths {3, 2}, memory_lengths {4, 1}. Mask value at
  // [b, t, s] is visible unless ((b + t + s) % 3 == 0); padding entries are NaN (ignored).
  v1::AttendRequest request = Rank3Request();
  std::vector<float> mask(2 * 3 * 4);
  std::vector<uint8_t> expected;
  const int64_t query_lengths[] = {3, 2};
  const int64_t key_lengths[] = {4, 1};
  const float visible[] = {1.0f, -2.5f, 0.5f};
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t s = 0; s < 4; ++s) {
        const bool valid = t < query_lengths[b] && s < key_lengths[b];
        const bool blocked = (b + t + s) % 3 == 0;
        mask[(b * 3 + t) * 4 + s] = !valid ? kNaN : blocked ? 0.0f : visible[(t + s) % 3];
        if (valid) expected.push_back(blocked ? 0 : 1);
      }
    }
  }
  SetTensor(request.mutable_attn_mask(), {2, 3, 4}, mask, /*raw=*/true);
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_EQ(work->explicit_mask.size(), 3u * 4 + 2 * 1);
  EXPECT_THAT(work->explicit_mask, ElementsAreArray(expected));
}

TEST(ParseAttendRequestTest, AttnMaskSelfAttentionRank2UsesLengthForBothSides) {
  v1::AttendRequest request;
  SetSequential(request.mutable_input(), {3, kD});
  request.add_lengths(2);
  // [T, S] = [3, 3]; only the top-left 2x2 is valid: {1, 0; -0.0, 7}. -0.0 is blocked.
  SetTensor(request.mutable_attn_mask(), {3, 3}, {1, 0, kNaN, -0.0f, 7, kInf, kNaN, kNaN, kNaN});
  const absl::StatusOr<AttendWork> work = Parse(request);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_THAT(work->explicit_mask, ElementsAre(1, 0, 0, 1));
  EXPECT_THAT(work->query_lengths, ElementsAre(2));
}

TEST(ParseAttendRequestTest, LimitsAreInclusive) {
  ModelLimits exact;
  exact.batching.max_batch_sequences = 2;
  exact.batching.max_batch_tokens = 5;
  exact.request = {.max_sequence_length = 4, .max_response_bytes = 384};
  EXPECT_TRUE(Parse(Rank3Request(), exact).ok());
  // Without weights the response is the 192-byte output alone.
  v1::AttendRequest request = Rank3Request();
  request.set_return_weights(false);
  EXPECT_TRUE(Parse(request, {.batching = {}, .request = {.max_response_bytes = 192}}).ok());
  EXPECT_FALSE(Parse(request, {.batching = {}, .request = {.max_response_bytes = 191}}).ok());
}

// 16-bit raw tensors: decoded exactly. Values chosen by hand so their 16-bit encodings are
// known: every one is exactly representable in both formats (integers up to 256 and halves),
// except those that test the rounding.
TEST(ParseAttendRequestTest, SixteenBitRawDecodesExactly) {
  for (v1::DataType dtype : {v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP16}) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    v1::AttendRequest request = Rank3Request();
    std::vector<float> input = Sequential(2 * 3 * kD, -20.5f);  // -20.5 .. 26.5
    input[0] = -0.0f;
    SetRawTensor(request.mutable_input(), {2, 3, kD}, input, dtype);
    SetRawTensor(request.mutable_memory(), {2, 4, kD}, Sequential(64, 0.25f), dtype);
    std::vector<float> mask(24, 1.0f);
    mask[1] = 0.0f;
    SetRawTensor(request.mutable_attn_mask(), {2, 3, 4}, mask, dtype);
    ASSERT_EQ(request.input().raw().size(), 48u * 2);
    const absl::StatusOr<AttendWork> work = Parse(request);
    ASSERT_TRUE(work.ok()) << work.status();
    const std::vector<float> expected_input(input.begin(), input.begin() + 5 * kD);
    EXPECT_THAT(Bits(work->query), ElementsAreArray(Bits(expected_input)));
    std::vector<float> expected_memory = Sequential(4 * kD, 0.25f);
    for (float v : Sequential(kD, 0.25f + 4 * kD)) expected_memory.push_back(v);
    EXPECT_THAT(work->memory, ElementsAreArray(expected_memory));
    EXPECT_EQ(work->explicit_mask[1], 0);
    EXPECT_EQ(work->explicit_mask[0], 1);
  }
}

TEST(ParseAttendRequestTest, SixteenBitRawCarriesTheRoundedValues) {
  // 1 + 2^-9 is below half a bf16 step (1 + 2^-8 would be the tie) and exact in binary16;
  // 1 + 2^-12 is below half a binary16 step; 300.5 is a bf16 tie-free case: 300 (step 2).
  const float small_bump = 1.0f + 1.0f / 512;
  const float tiny_bump = 1.0f + 1.0f / 4096;
  std::vector<float> input = Sequential(3 * kD, 1.0f);
  input[0] = small_bump;
  input[1] = tiny_bump;
  input[2] = 300.5f;
  const float expected_bf16[] = {1.0f, 1.0f, 300.0f};
  const float expected_fp16[] = {small_bump, 1.0f, 300.5f};
  for (v1::DataType dtype : {v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP16}) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    v1::AttendRequest request = Rank2Request();
    SetRawTensor(request.mutable_input(), {3, kD}, input, dtype);
    const absl::StatusOr<AttendWork> work = Parse(request);
    ASSERT_TRUE(work.ok()) << work.status();
    const float* expected = dtype == v1::DATA_TYPE_BF16 ? expected_bf16 : expected_fp16;
    EXPECT_THAT(std::vector<float>(work->query.begin(), work->query.begin() + 3),
                ElementsAre(expected[0], expected[1], expected[2]));
  }
}

TEST(ParseAttendRequestTest, RawOutputDtypeIsCopied) {
  v1::AttendRequest request = Rank3Request();
  EXPECT_EQ(Parse(request)->raw_output_format, FloatFormat::kFloat32);
  request.set_raw_output(true);
  request.set_raw_output_dtype(v1::DATA_TYPE_BF16);
  EXPECT_EQ(Parse(request)->raw_output_format, FloatFormat::kBFloat16);
  request.set_raw_output_dtype(v1::DATA_TYPE_FP16);
  EXPECT_EQ(Parse(request)->raw_output_format, FloatFormat::kFloat16);
}

// The point of the 16-bit types: a T=128, d=512 request is about half the bytes.
TEST(ParseAttendRequestTest, SixteenBitRequestsSerializeToHalfTheBytes) {
  const std::vector<float> values = Sequential(128 * 512, -1000.0f);
  v1::AttendRequest fp32;
  SetRawTensor(fp32.mutable_input(), {128, 512}, values, v1::DATA_TYPE_FP32);
  fp32.set_raw_output(true);
  for (v1::DataType dtype : {v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP16}) {
    v1::AttendRequest half = fp32;
    SetRawTensor(half.mutable_input(), {128, 512}, values, dtype);
    half.set_raw_output_dtype(dtype);
    // 256 KiB of raw bytes against 128 KiB; the rest (shape, tags, lengths, flags, the two
    // dtypes) is a few bytes.
    EXPECT_GT(fp32.ByteSizeLong(), 262144u);
    EXPECT_LT(fp32.ByteSizeLong(), 262144u + 32);
    EXPECT_GT(half.ByteSizeLong(), 131072u);
    EXPECT_LT(half.ByteSizeLong(), 131072u + 32);
  }
}

}  // namespace
}  // namespace attnserve::testing
