// ParseAttendRequest refuses every bad input with INVALID_ARGUMENT naming the field, the
// expected and the received value, and hostile values (overflowing shapes, giant counts) cleanly.
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
#include "server/runtime/attend_work.h"
#include "tests/server/conversion/conversion_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;
namespace v1 = ::attnserve::v1;
using server::AttendWork;
using server::ModelLimits;

// Every bad input: InvalidArgument naming the field, the expected and the received value.

struct BadCase {
  std::string name;
  bool rank2 = false;  // mutate Rank2Request() instead of Rank3Request()
  std::function<void(v1::AttendRequest&)> mutate;
  std::string field, expected, received;
  ModelLimits limits = {};
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadRequestTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadRequestTest, RejectedNamingFieldExpectedAndReceived) {
  const BadCase& c = GetParam();
  v1::AttendRequest request = c.rank2 ? Rank2Request() : Rank3Request();
  ASSERT_TRUE(Parse(request).ok()) << "the base request must be valid";
  c.mutate(request);
  const absl::StatusOr<AttendWork> work = Parse(request, c.limits);
  ASSERT_FALSE(work.ok());
  EXPECT_EQ(work.status().code(), absl::StatusCode::kInvalidArgument) << work.status();
  const std::string message(work.status().message());
  EXPECT_THAT(message, HasSubstr(c.field + ":"));
  EXPECT_THAT(message, HasSubstr(c.expected));
  EXPECT_THAT(message, HasSubstr(c.received));
}

ModelLimits With(std::function<void(ModelLimits&)> change) {
  ModelLimits limits;
  change(limits);
  return limits;
}

std::vector<BadCase> BadCases() {
  using R = v1::AttendRequest;
  const std::string tiny = "of model \"tiny\"";
  return {
      // input
      {"InputMissing", false, [](R& r) { r.clear_input(); }, "input", "[T, d_model]", "got none"},
      {"InputRank1", false, [](R& r) { SetSequential(r.mutable_input(), {48}); }, "input.shape",
       "expected rank 2 ([T, d_model]) or 3", "got rank 1 [48]"},
      {"InputRank4", false,
       [](R& r) {
         SetSequential(r.mutable_input(), {1, 2, 3, kD});
       },
       "input.shape", "expected rank 2", "got rank 4 [1, 2, 3, 8]"},
      {"InputRank0", false, [](R& r) { r.mutable_input()->clear_shape(); }, "input.shape",
       "expected rank 2", "got rank 0 []"},
      {"InputZeroDim", false, [](R& r) { r.mutable_input()->set_shape(1, 0); }, "input.shape[1]",
       "expected > 0", "got 0"},
      {"InputNegativeDim", false, [](R& r) { r.mutable_input()->set_shape(0, -2); },
       "input.shape[0]", "expected > 0", "got -2"},
      {"InputWrongDModel", false,
       [](R& r) {
         SetSequential(r.mutable_input(), {2, 3, 16});
       },
       "input.shape[2]", "expected d_model 8 " + tiny, "got 16"},
      {"InputWrongDModelRank2", true,
       [](R& r) {
         SetSequential(r.mutable_input(), {3, 4});
       },
       "input.shape[1]", "expected d_model 8 " + tiny, "got 4"},
      {"InputBothValuesAndRaw", false, [](R& r) { r.mutable_input()->set_raw("abcd"); }, "input",
       "expected exactly one of values or raw", "got both (48 values and 4 raw bytes)"},
      {"InputNeitherValuesNorRaw", false, [](R& r) { r.mutable_input()->clear_values(); }, "input",
       "expected exactly one of values or raw", "got neither"},
      {"InputRawNotWholeFloats", false,
       [](R& r) {
         SetSequential(r.mutable_input(), {2, 3, kD}, 0.0f, true);
         r.mutable_input()->mutable_raw()->pop_back();
       },
       "input.raw", "expected 192 bytes (48 DATA_TYPE_FP32 elements of shape [2, 3, 8]",
       "got 191 bytes"},
      {"InputTooFewValues", false, [](R& r) { r.mutable_input()->mutable_values()->RemoveLast(); },
       "input.values", "expected 48 elements (the product of shape [2, 3, 8])", "got 47"},
      {"InputTooManyRawFloats", false,
       [](R& r) {
         SetTensor(r.mutable_input(), {2, 3, kD}, Sequential(49), true);
       },
       "input.raw", "expected 192 bytes", "got 196 bytes"},
      {"InputBf16GivenFloat32Bytes", false,
       [](R& r) {
         SetTensor(r.mutable_input(), {2, 3, kD}, Sequential(48), true);
         r.mutable_input()->set_dtype(v1::DATA_TYPE_BF16);
       },
       "input.raw",
       "expected 96 bytes (48 DATA_TYPE_BF16 elements of shape [2, 3, 8], 2 bytes each)",
       "got 192 bytes"},
      {"InputFp16OddBytes", false,
       [](R& r) {
         SetRawTensor(r.mutable_input(), {2, 3, kD}, Sequential(48), v1::DATA_TYPE_FP16);
         r.mutable_input()->mutable_raw()->pop_back();
       },
       "input.raw", "expected 96 bytes (48 DATA_TYPE_FP16 elements", "got 95 bytes"},
      {"InputUnknownDtype", false,
       [](R& r) {
         SetTensor(r.mutable_input(), {2, 3, kD}, Sequential(48), true);
         r.mutable_input()->set_dtype(static_cast<v1::DataType>(7));
       },
       "input.dtype", "expected DATA_TYPE_FP32 (0), DATA_TYPE_BF16 (1) or DATA_TYPE_FP16 (2)",
       "got 7"},
      {"InputDtypeWithValues", false,
       [](R& r) { r.mutable_input()->set_dtype(v1::DATA_TYPE_FP16); }, "input.dtype",
       "expected DATA_TYPE_FP32 with values", "got DATA_TYPE_FP16"},
      {"InputInfFp16", false,
       [](R& r) {
         std::vector<float> values = Sequential(48);
         values[kD + 1] = 70000.0f;  // Beyond binary16's range: encoded as +inf.
         SetRawTensor(r.mutable_input(), {2, 3, kD}, values, v1::DATA_TYPE_FP16);
       },
       "input[0, 1, 1]", "expected a finite value", "got inf"},
      {"InputNaN", false, [](R& r) { r.mutable_input()->set_values((1 * 3 + 1) * kD + 5, kNaN); },
       "input[1, 1, 5]", "expected a finite value", "got nan"},
      {"InputInfRaw", false,
       [](R& r) {
         std::vector<float> values = Sequential(48);
         values[2 * kD] = -kInf;  // [0, 2, 0]
         SetTensor(r.mutable_input(), {2, 3, kD}, values, true);
       },
       "input[0, 2, 0]", "expected a finite value", "got -inf"},
      {"InputInfRank2", true, [](R& r) { r.mutable_input()->set_values(2 * kD + 7, kInf); },
       "input[2, 7]", "expected a finite value", "got inf"},
      // lengths
      {"LengthsTooFew", false, [](R& r) { r.mutable_lengths()->RemoveLast(); }, "lengths",
       "expected 2 entries (one per sequence) or none", "got 1"},
      {"LengthsTooManyRank2", true,
       [](R& r) {
         r.add_lengths(3);
         r.add_lengths(3);
       },
       "lengths", "expected 1 entries", "got 2"},
      {"LengthZero", false, [](R& r) { r.set_lengths(1, 0); }, "lengths[1]", "expected 1..3",
       "got 0"},
      {"LengthNegative", false, [](R& r) { r.set_lengths(0, -1); }, "lengths[0]", "expected 1..3",
       "got -1"},
      {"LengthPastT", false, [](R& r) { r.set_lengths(0, 4); }, "lengths[0]", "expected 1..3",
       "got 4"},
      // memory
      {"MemoryRankDiffers", false,
       [](R& r) {
         SetSequential(r.mutable_memory(), {4, kD});
       },
       "memory.shape", "expected rank 3 (the input's rank)", "got rank 2 [4, 8]"},
      {"MemoryRankDiffersRank2", true,
       [](R& r) {
         r.clear_attn_mask();
         SetSequential(r.mutable_memory(), {1, 4, kD});
       },
       "memory.shape", "expected rank 2", "got rank 3"},
      {"MemoryNegativeDim", false, [](R& r) { r.mutable_memory()->set_shape(1, -4); },
       "memory.shape[1]", "expected > 0", "got -4"},
      {"MemoryWrongDModel", false,
       [](R& r) {
         SetSequential(r.mutable_memory(), {2, 4, 16});
       },
       "memory.shape[2]", "expected d_model 8 " + tiny, "got 16"},
      {"MemoryWrongBatch", false,
       [](R& r) {
         SetSequential(r.mutable_memory(), {3, 4, kD});
       },
       "memory.shape[0]", "expected 2 (B", "got 3"},
      {"MemoryNeither", false, [](R& r) { r.mutable_memory()->clear_values(); }, "memory",
       "expected exactly one of values or raw", "got neither"},
      {"MemoryBothValuesAndRaw", false, [](R& r) { r.mutable_memory()->set_raw("abcd"); }, "memory",
       "expected exactly one of values or raw", "got both"},
      {"MemoryRawNotWholeFloats", false,
       [](R& r) {
         r.mutable_memory()->clear_values();
         r.mutable_memory()->set_raw("abcdef");
       },
       "memory.raw", "expected 256 bytes (64 DATA_TYPE_FP32 elements", "got 6 bytes"},
      {"MemoryBf16TooFewBytes", false,
       [](R& r) {
         SetRawTensor(r.mutable_memory(), {2, 4, kD}, Sequential(63), v1::DATA_TYPE_BF16);
       },
       "memory.raw", "expected 128 bytes (64 DATA_TYPE_BF16 elements", "got 126 bytes"},
      {"MemoryTooFewValues", false,
       [](R& r) { r.mutable_memory()->mutable_values()->RemoveLast(); }, "memory.values",
       "expected 64 elements", "got 63"},
      {"MemoryNaN", false, [](R& r) { r.mutable_memory()->set_values((1 * 4 + 0) * kD + 3, kNaN); },
       "memory[1, 0, 3]", "expected a finite value", "got nan"},
      {"MemoryLengthsTooMany", false, [](R& r) { r.add_memory_lengths(1); }, "memory_lengths",
       "expected 2 entries", "got 3"},
      {"MemoryLengthPastS", false, [](R& r) { r.set_memory_lengths(0, 5); }, "memory_lengths[0]",
       "expected 1..4 (S", "got 5"},
      {"MemoryLengthZero", false, [](R& r) { r.set_memory_lengths(1, 0); }, "memory_lengths[1]",
       "expected 1..4", "got 0"},
      {"MemoryLengthsWithoutMemory", false, [](R& r) { r.clear_memory(); }, "memory_lengths",
       "expected none without memory", "got 2 entries"},
      // mask
      {"RawOutputDtypeUnknown", false,
       [](R& r) {
         r.set_raw_output(true);
         r.set_raw_output_dtype(static_cast<v1::DataType>(9));
       },
       "raw_output_dtype", "expected DATA_TYPE_FP32 (0), DATA_TYPE_BF16 (1) or DATA_TYPE_FP16 (2)",
       "got 9"},
      {"RawOutputDtypeWithoutRawOutput", false,
       [](R& r) { r.set_raw_output_dtype(v1::DATA_TYPE_BF16); }, "raw_output_dtype",
       "expected DATA_TYPE_FP32 without raw_output", "got DATA_TYPE_BF16"},
      {"MaskUnknown", false, [](R& r) { r.set_mask(static_cast<v1::MaskKind>(7)); }, "mask",
       "expected MASK_NONE (0) or MASK_CAUSAL (1)", "got 7"},
      {"MaskNegative", false, [](R& r) { r.set_mask(static_cast<v1::MaskKind>(-1)); }, "mask",
       "expected MASK_NONE (0) or MASK_CAUSAL (1)", "got -1"},
      // attn_mask
      {"AttnMaskRank", false,
       [](R& r) {
         SetTensor(r.mutable_attn_mask(), {3, 4}, std::vector<float>(12, 1));
       },
       "attn_mask.shape", "expected rank 3 ([B, T, S])", "got rank 2 [3, 4]"},
      {"AttnMaskRankRank2", true,
       [](R& r) {
         SetTensor(r.mutable_attn_mask(), {1, 3, 3}, std::vector<float>(9, 1));
       },
       "attn_mask.shape", "expected rank 2 ([T, S])", "got rank 3 [1, 3, 3]"},
      {"AttnMaskWrongB", false,
       [](R& r) {
         SetTensor(r.mutable_attn_mask(), {1, 3, 4}, std::vector<float>(12, 1));
       },
       "attn_mask.shape[0]", "expected 2 (B, the input's batch size)", "got 1"},
      {"AttnMaskWrongT", false,
       [](R& r) {
         SetTensor(r.mutable_attn_mask(), {2, 4, 4}, std::vector<float>(32, 1));
       },
       "attn_mask.shape[1]", "expected 3 (T", "got 4"},
      {"AttnMaskWrongS", false,
       [](R& r) {
         SetTensor(r.mutable_attn_mask(), {2, 3, 3}, std::vector<float>(18, 1));
       },
       "attn_mask.shape[2]", "expected 4 (S, the memory's padded length)", "got 3"},
      {"AttnMaskWrongSRank2", true,
       [](R& r) {
         SetTensor(r.mutable_attn_mask(), {3, 4}, std::vector<float>(12, 1));
       },
       "attn_mask.shape[1]", "expected 3 (S = T", "got 4"},
      {"AttnMaskNegativeDim", false, [](R& r) { r.mutable_attn_mask()->set_shape(2, -4); },
       "attn_mask.shape[2]", "expected 4", "got -4"},
      {"AttnMaskNeither", false, [](R& r) { r.mutable_attn_mask()->clear_values(); }, "attn_mask",
       "expected exactly one of values or raw", "got neither"},
      {"AttnMaskRawNotWholeFloats", false,
       [](R& r) {
         r.mutable_attn_mask()->clear_values();
         r.mutable_attn_mask()->set_raw(std::string(95, '\0'));
       },
       "attn_mask.raw", "expected 96 bytes (24 DATA_TYPE_FP32 elements", "got 95 bytes"},
      {"AttnMaskFp16TooManyBytes", false,
       [](R& r) {
         SetRawTensor(r.mutable_attn_mask(), {2, 3, 4}, std::vector<float>(25, 1.0f),
                      v1::DATA_TYPE_FP16);
       },
       "attn_mask.raw", "expected 48 bytes (24 DATA_TYPE_FP16 elements", "got 50 bytes"},
      {"AttnMaskTooFewValues", false,
       [](R& r) { r.mutable_attn_mask()->mutable_values()->RemoveLast(); }, "attn_mask.values",
       "expected 24 elements", "got 23"},
      {"AttnMaskNaN", false, [](R& r) { r.mutable_attn_mask()->set_values(2 * 4 + 3, kNaN); },
       "attn_mask[0, 2, 3]", "expected a finite value", "got nan"},
      {"AttnMaskInfRank2", true, [](R& r) { r.mutable_attn_mask()->set_values(1 * 3 + 2, kInf); },
       "attn_mask[1, 2]", "expected a finite value", "got inf"},
      // head_mask
      {"HeadMaskTooMany", false, [](R& r) { r.add_head_mask(true); }, "head_mask",
       "expected none or 2 entries (num_heads " + tiny + ")", "got 3"},
      {"HeadMaskTooFew", false, [](R& r) { r.mutable_head_mask()->RemoveLast(); }, "head_mask",
       "expected none or 2 entries", "got 1"},
      // limits
      {"QueryTooLong", false, [](R&) {}, "input.shape[1]",
       "expected a sequence length <= max_sequence_length 2 " + tiny, "got 3",
       With([](ModelLimits& l) { l.request.max_sequence_length = 2; })},
      {"QueryTooLongRank2", true, [](R&) {}, "input.shape[0]", "max_sequence_length 2 " + tiny,
       "got 3", With([](ModelLimits& l) { l.request.max_sequence_length = 2; })},
      {"MemoryTooLong", false, [](R&) {}, "memory.shape[1]", "max_sequence_length 3 " + tiny,
       "got 4", With([](ModelLimits& l) { l.request.max_sequence_length = 3; })},
      {"TooManySequences", false, [](R&) {}, "input.shape[0]", "max_batch_sequences 1 " + tiny,
       "got 2", With([](ModelLimits& l) { l.batching.max_batch_sequences = 1; })},
      {"TooManyTokens", false, [](R&) {}, "lengths", "max_batch_tokens 4 " + tiny, "got 5",
       With([](ModelLimits& l) { l.batching.max_batch_tokens = 4; })},
      // Output 2·3·8·4 = 192 bytes plus weights 2·2·3·4·4 = 192 bytes.
      {"ResponseTooLarge", false, [](R&) {},
       "response size (input.shape, memory.shape, return_weights)",
       "max_response_bytes 383 " + tiny, "got 384 bytes",
       With([](ModelLimits& l) { l.request.max_response_bytes = 383; })},
  };
}

INSTANTIATE_TEST_SUITE_P(Conversion, BadRequestTest, ::testing::ValuesIn(BadCases()),
                         [](const auto& test_info) { return test_info.param.name; });

// ---------------------------------------------------------------------------------------------
// Hostile values: clean errors, never a crash, an overflow or a giant allocation.

ModelLimits Unlimited() {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ModelLimits limits;
  limits.batching.max_batch_sequences = kMax;
  limits.batching.max_batch_tokens = kMax;
  limits.request = {.max_sequence_length = kMax, .max_response_bytes = kMax};
  return limits;
}

void ExpectInvalid(const v1::AttendRequest& request, const ModelLimits& limits,
                   const std::string& field, const std::string& received) {
  const absl::StatusOr<AttendWork> work = Parse(request, limits);
  ASSERT_FALSE(work.ok());
  EXPECT_EQ(work.status().code(), absl::StatusCode::kInvalidArgument) << work.status();
  EXPECT_THAT(std::string(work.status().message()), HasSubstr(field));
  EXPECT_THAT(std::string(work.status().message()), HasSubstr(received));
  EXPECT_LT(work.status().message().size(), 400u) << "messages stay short";
}

TEST(HostileRequestTest, OverflowingShapesAreCleanErrors) {
  constexpr int64_t kHuge = int64_t{1} << 62;
  v1::AttendRequest request = Rank3Request();
  SetTensor(request.mutable_input(), {kHuge, kHuge, kD}, Sequential(kD));
  ExpectInvalid(request, {}, "max_batch_sequences 64", "got 4611686018427387904");
  // With no limits in the way, the element count check must not overflow either.
  ExpectInvalid(request, Unlimited(), "input.values", "more than 2^63");
  ExpectInvalid(request, Unlimited(), "input.values", "got 8");
  SetTensor(request.mutable_input(), {1 << 20, 1 << 20, kD}, Sequential(kD), true);
  ExpectInvalid(request, Unlimited(), "expected 35184372088832 bytes (8796093022208",
                "got 32 bytes");
  SetTensor(request.mutable_input(), {std::numeric_limits<int64_t>::max(), 1, kD}, {}, true);
  request.mutable_input()->set_raw("\1\2\3\4");
  ExpectInvalid(request, Unlimited(), "input.raw", "got 4 bytes");
  ExpectInvalid(request, Unlimited(), "input.raw", "expected more than 2^63 bytes");
}

TEST(HostileRequestTest, NegativeAndMinimalDimsAreCleanErrors) {
  v1::AttendRequest request = Rank3Request();
  SetTensor(request.mutable_input(), {std::numeric_limits<int64_t>::min(), 3, kD}, Sequential(48));
  ExpectInvalid(request, Unlimited(), "input.shape[0]", "got -9223372036854775808");
  SetTensor(request.mutable_input(), {-1, -1, -kD}, Sequential(48));
  ExpectInvalid(request, Unlimited(), "input.shape[0]", "got -1");
  request = Rank3Request();
  SetTensor(request.mutable_memory(), {2, int64_t{1} << 61, kD}, Sequential(64));
  ExpectInvalid(request, Unlimited(), "memory.values", "got 64");
  request = Rank3Request();
  SetTensor(request.mutable_attn_mask(), {2, 3, int64_t{1} << 62}, Sequential(24));
  ExpectInvalid(request, Unlimited(), "attn_mask.shape[2]", "got 4611686018427387904");
}

TEST(HostileRequestTest, GiantCountsAreCleanErrors) {
  v1::AttendRequest request = Rank3Request();
  request.set_lengths(0, std::numeric_limits<int32_t>::max());
  ExpectInvalid(request, Unlimited(), "lengths[0]", "got 2147483647");
  request.set_lengths(0, std::numeric_limits<int32_t>::min());
  ExpectInvalid(request, Unlimited(), "lengths[0]", "got -2147483648");
  request = Rank3Request();
  request.mutable_lengths()->Resize(1'000'000, 1);
  ExpectInvalid(request, Unlimited(), "lengths", "got 1000000");
  request = Rank3Request();
  request.mutable_head_mask()->Resize(1'000'000, true);
  ExpectInvalid(request, Unlimited(), "head_mask", "got 1000000");
  request = Rank3Request();
  request.mutable_input()->mutable_shape()->Resize(1'000'000, 1);
  ExpectInvalid(request, Unlimited(), "input.shape", "got rank 1000000 [2, 3, 8, 1, 1, 1, ...]");
}

TEST(HostileRequestTest, ModelWithoutLayerIsInternal) {
  const absl::StatusOr<AttendWork> work = server::ParseAttendRequest(Rank3Request(), nullptr, {});
  EXPECT_EQ(work.status().code(), absl::StatusCode::kInternal);
}

TEST(HostileRequestTest, ResponseLimitIsCappedAtProtobufsMessageSize) {
  // [64, 4096, 8]: 8 MiB of output and 64·2·4096·4096·4 = 8 GiB of weights, over any message.
  v1::AttendRequest request;
  SetTensor(request.mutable_input(), {64, 4096, kD}, std::vector<float>(64 * 4096 * kD, 0.5f),
            /*raw=*/true);
  request.set_return_weights(true);
  ExpectInvalid(request, Unlimited(), "max_response_bytes 2147483647", "got 8598323200 bytes");
}

}  // namespace
}  // namespace attnserve::testing
