// server/conversion: every request check (field, expected and received value in the message),
// hostile shapes and counts, packing without padding, padding the answer back, ModelInfo and the
// absl -> gRPC status mapping.
#include "server/conversion.h"

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
#include "core/attention_config.h"
#include "core/attention_layer.h"
#include "core/attention_weights.h"
#include "core/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attend_work.h"

namespace attnserve::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
namespace v1 = ::attnserve::v1;
using server::AttendResult;
using server::AttendWork;
using server::RequestLimits;

constexpr int64_t kD = 8;
constexpr int64_t kHeads = 2;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::shared_ptr<const model::Model> TinyModel() {
  static const std::shared_ptr<const model::Model> tiny = [] {
    const core::AttentionConfig config{.d_model = kD, .num_heads = kHeads, .bias = true};
    auto layer = core::AttentionLayer::Create(config, core::MakeRandomWeights(config, 7));
    EXPECT_TRUE(layer.ok()) << layer.status();
    auto model = std::make_shared<model::Model>();
    model->name = "tiny";
    model->config.attention = config;
    model->layer = layer.ok() ? *layer : nullptr;
    model->source = "embedded";
    model->version = 3;
    return std::shared_ptr<const model::Model>(std::move(model));
  }();
  return tiny;
}

// start, start + 1, ...: every element of a tensor is distinct, so packed rows can be traced back.
std::vector<float> Sequential(int64_t count, float start = 0.0f) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = start + static_cast<float>(i);
  return values;
}

void SetTensor(v1::Tensor* tensor, const std::vector<int64_t>& shape,
               const std::vector<float>& values, bool raw = false) {
  tensor->Clear();
  for (int64_t dim : shape) tensor->add_shape(dim);
  if (raw) {
    tensor->set_raw(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  } else {
    tensor->mutable_values()->Add(values.begin(), values.end());
  }
}

// A shape filled with Sequential(product, start).
void SetSequential(v1::Tensor* tensor, const std::vector<int64_t>& shape, float start = 0.0f,
                   bool raw = false) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  SetTensor(tensor, shape, Sequential(count, start), raw);
}

std::vector<float> RawFloats(const v1::Tensor& tensor) {
  std::vector<float> values(tensor.raw().size() / sizeof(float));
  std::memcpy(values.data(), tensor.raw().data(), values.size() * sizeof(float));
  return values;
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float value : values) bits.push_back(std::bit_cast<uint32_t>(value));
  return bits;
}

// Valid rank-3 cross-attention request using every field: input [2, 3, 8] with lengths {3, 2},
// memory [2, 4, 8] with memory_lengths {4, 1}, attn_mask [2, 3, 4], head_mask, weights.
v1::AttendRequest Rank3Request() {
  v1::AttendRequest request;
  SetSequential(request.mutable_input(), {2, 3, kD});
  request.add_lengths(3);
  request.add_lengths(2);
  SetSequential(request.mutable_memory(), {2, 4, kD}, 1000.0f);
  request.add_memory_lengths(4);
  request.add_memory_lengths(1);
  SetTensor(request.mutable_attn_mask(), {2, 3, 4}, std::vector<float>(24, 1.0f));
  request.add_head_mask(true);
  request.add_head_mask(false);
  request.set_return_weights(true);
  return request;
}

// Valid rank-2 self-attention request: input [3, 8], attn_mask [3, 3].
v1::AttendRequest Rank2Request() {
  v1::AttendRequest request;
  SetSequential(request.mutable_input(), {3, kD});
  SetTensor(request.mutable_attn_mask(), {3, 3}, std::vector<float>(9, 1.0f));
  return request;
}

absl::StatusOr<AttendWork> Parse(const v1::AttendRequest& request,
                                 const RequestLimits& limits = {}) {
  return server::ParseAttendRequest(request, TinyModel(), limits);
}

// ---------------------------------------------------------------------------------------------
// Every bad input: InvalidArgument naming the field, the expected and the received value.

struct BadCase {
  std::string name;
  bool rank2 = false;  // mutate Rank2Request() instead of Rank3Request()
  std::function<void(v1::AttendRequest&)> mutate;
  std::string field, expected, received;
  RequestLimits limits = {};
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

RequestLimits With(std::function<void(RequestLimits&)> change) {
  RequestLimits limits;
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
       "input.raw", "expected a multiple of 4 bytes", "got 191 bytes"},
      {"InputTooFewValues", false, [](R& r) { r.mutable_input()->mutable_values()->RemoveLast(); },
       "input.values", "expected 48 elements (the product of shape [2, 3, 8])", "got 47"},
      {"InputTooManyRawFloats", false,
       [](R& r) {
         SetTensor(r.mutable_input(), {2, 3, kD}, Sequential(49), true);
       },
       "input.raw", "expected 48 elements", "got 49"},
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
       "memory.raw", "expected a multiple of 4 bytes", "got 6 bytes"},
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
       "attn_mask.raw", "expected a multiple of 4 bytes", "got 95 bytes"},
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
       With([](RequestLimits& l) { l.max_sequence_length = 2; })},
      {"QueryTooLongRank2", true, [](R&) {}, "input.shape[0]", "max_sequence_length 2 " + tiny,
       "got 3", With([](RequestLimits& l) { l.max_sequence_length = 2; })},
      {"MemoryTooLong", false, [](R&) {}, "memory.shape[1]", "max_sequence_length 3 " + tiny,
       "got 4", With([](RequestLimits& l) { l.max_sequence_length = 3; })},
      {"TooManySequences", false, [](R&) {}, "input.shape[0]", "max_batch_sequences 1 " + tiny,
       "got 2", With([](RequestLimits& l) { l.max_batch_sequences = 1; })},
      {"TooManyTokens", false, [](R&) {}, "lengths", "max_batch_tokens 4 " + tiny, "got 5",
       With([](RequestLimits& l) { l.max_batch_tokens = 4; })},
      // Output 2·3·8·4 = 192 bytes plus weights 2·2·3·4·4 = 192 bytes.
      {"ResponseTooLarge", false, [](R&) {},
       "response size (input.shape, memory.shape, return_weights)",
       "max_response_bytes 383 " + tiny, "got 384 bytes",
       With([](RequestLimits& l) { l.max_response_bytes = 383; })},
  };
}

INSTANTIATE_TEST_SUITE_P(Conversion, BadRequestTest, ::testing::ValuesIn(BadCases()),
                         [](const auto& test_info) { return test_info.param.name; });

// ---------------------------------------------------------------------------------------------
// Hostile values: clean errors, never a crash, an overflow or a giant allocation.

RequestLimits Unlimited() {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return {.max_sequence_length = kMax,
          .max_batch_sequences = kMax,
          .max_batch_tokens = kMax,
          .max_response_bytes = kMax};
}

void ExpectInvalid(const v1::AttendRequest& request, const RequestLimits& limits,
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
  ExpectInvalid(request, Unlimited(), "expected 8796093022208 elements", "got 8");
  SetTensor(request.mutable_input(), {std::numeric_limits<int64_t>::max(), 1, kD}, {}, true);
  request.mutable_input()->set_raw("\1\2\3\4");
  ExpectInvalid(request, Unlimited(), "input.raw", "got 1");
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

// ---------------------------------------------------------------------------------------------
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
  const RequestLimits exact{.max_sequence_length = 4,
                            .max_batch_sequences = 2,
                            .max_batch_tokens = 5,
                            .max_response_bytes = 384};
  EXPECT_TRUE(Parse(Rank3Request(), exact).ok());
  // Without weights the response is the 192-byte output alone.
  v1::AttendRequest request = Rank3Request();
  request.set_return_weights(false);
  EXPECT_TRUE(Parse(request, {.max_response_bytes = 192}).ok());
  EXPECT_FALSE(Parse(request, {.max_response_bytes = 191}).ok());
}

TEST(ParseAttendRequestTest, ResponseLimitIsCappedAtProtobufsMessageSize) {
  // [64, 4096, 8]: 8 MiB of output and 64·2·4096·4096·4 = 8 GiB of weights, over any message.
  v1::AttendRequest request;
  SetTensor(request.mutable_input(), {64, 4096, kD}, std::vector<float>(64 * 4096 * kD, 0.5f),
            /*raw=*/true);
  request.set_return_weights(true);
  ExpectInvalid(request, Unlimited(), "max_response_bytes 2147483647", "got 8598323200 bytes");
}

// ---------------------------------------------------------------------------------------------
// FillAttendResponse.

// A result for `work` whose values are distinct: output = 0.5 + i, weights = -1 - i.
// The spans view buffers that result.storage owns, as the batch runner's do.
AttendResult ResultFor(const AttendWork& work) {
  struct Buffers {
    std::vector<float> output, weights;
  };
  auto buffers = std::make_shared<Buffers>();
  buffers->output = Sequential(work.tokens() * kD, 0.5f);
  if (work.return_weights) {
    int64_t scores = 0;
    for (int64_t b = 0; b < work.sequences(); ++b) {
      const auto& keys = work.cross_attention ? work.memory_lengths : work.query_lengths;
      scores += work.query_lengths[b] * keys[b];
    }
    for (float v : Sequential(kHeads * scores)) buffers->weights.push_back(-1.0f - v);
  }
  AttendResult result;
  result.output = buffers->output;
  result.weights = buffers->weights;
  result.storage = buffers;
  result.timing = {.queue_us = 11, .compute_us = 22, .batch_sequences = 5, .batch_tokens = 77};
  return result;
}

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
// FillModelInfo and ToGrpcStatus.

TEST(FillModelInfoTest, DescribesModelAndLimits) {
  const server::ModelLimits limits{.request = {.max_sequence_length = 1024,
                                               .max_batch_sequences = 16,
                                               .max_batch_tokens = 2048,
                                               .max_response_bytes = 1 << 20},
                                   .max_queue_delay_us = 250,
                                   .max_queue_size = 99};
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
  EXPECT_EQ(info.max_sequence_length(), 1024);
  EXPECT_EQ(info.version(), 3);
  EXPECT_EQ(info.source(), "embedded");
  EXPECT_TRUE(info.is_default());
  server::FillModelInfo(*TinyModel(), limits, /*is_default=*/false, &info);
  EXPECT_FALSE(info.is_default());
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

TEST(ToGrpcStatusTest, CodeOutsideGrpcRangeIsUnknown) {
  const grpc::Status status =
      server::ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(status.error_message(), "odd");
}

}  // namespace
}  // namespace attnserve::testing
