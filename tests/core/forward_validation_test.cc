// Forward() with inputs or outputs that do not fit the layer: InvalidArgument naming the field,
// never a crash, and the executor keeps working for a valid call afterwards.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "core/forward/attention_batch.h"
#include "core/forward/attention_executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kDModel = 16;
constexpr int64_t kHeads = 4;

class ForwardValidationTest : public ::testing::Test {
 protected:
  ForwardValidationTest()
      : layer_(MakeTestLayer({.d_model = kDModel, .num_heads = kHeads, .bias = true}, 5)),
        valid_(MakeBatch(kDModel, {3, 5}, {}, 9)) {
    valid_.causal = true;
    SetRandomMask(valid_, 0.8, 10);
  }

  void SetUp() override {
    ASSERT_NE(layer_.layer, nullptr);
    // Warm the executor up so that the caches hold entries when the bad calls arrive.
    ExpectMatchesReference(executor_, *layer_.layer, layer_.weights, valid_);
  }

  // Forward(in, out) must fail with InvalidArgument mentioning `field`; then a valid call on the
  // same executor must still match the reference.
  void ExpectRejected(const core::AttentionInputs& in, const core::AttentionOutputs& out,
                      const std::string& field) {
    const absl::Status status = executor_.Forward(*layer_.layer, in, out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
    ExpectMatchesReference(executor_, *layer_.layer, layer_.weights, valid_);
  }

  // Output buffers sized for `batch` (weights included).
  struct Buffers {
    std::vector<float> output, weights;
    core::AttentionOutputs outputs() { return {.output = output, .weights = weights}; }
  };
  static Buffers BuffersFor(const TestBatch& batch) {
    return {std::vector<float>(static_cast<size_t>(batch.query_rows() * kDModel)),
            std::vector<float>(static_cast<size_t>(kHeads * batch.score_elements()))};
  }

  TestLayer layer_;
  TestBatch valid_;
  core::AttentionExecutor executor_;
};

TEST_F(ForwardValidationTest, QueryDataOneValueShort) {
  Buffers out = BuffersFor(valid_);
  core::AttentionInputs in = valid_.Inputs();
  in.query.data = in.query.data.first(in.query.data.size() - 1);
  ExpectRejected(in, out.outputs(), "query.data");
}

TEST_F(ForwardValidationTest, QueryDataOneRowTooMany) {
  Buffers out = BuffersFor(valid_);
  const std::vector<float> data = UniformValues(valid_.query_data.size() + kDModel, 3);
  core::AttentionInputs in = valid_.Inputs();
  in.query.data = data;
  ExpectRejected(in, out.outputs(), "query.data");
}

TEST_F(ForwardValidationTest, EmptyQuery) {
  Buffers out = BuffersFor(valid_);
  core::AttentionInputs in = valid_.Inputs();
  in.query = {};
  ExpectRejected(in, out.outputs(), "query.offsets");
}

TEST_F(ForwardValidationTest, OffsetsWithoutSequences) {
  Buffers out = BuffersFor(valid_);
  const std::vector<int64_t> offsets{0};
  core::AttentionInputs in = valid_.Inputs();
  in.query.offsets = offsets;
  in.query.data = {};
  ExpectRejected(in, out.outputs(), "query.offsets");
}

TEST_F(ForwardValidationTest, OffsetsNotStartingAtZero) {
  Buffers out = BuffersFor(valid_);
  const std::vector<int64_t> offsets{1, 3, 8};
  core::AttentionInputs in = valid_.Inputs();
  in.query.offsets = offsets;
  ExpectRejected(in, out.outputs(), "query.offsets[0]");
}

TEST_F(ForwardValidationTest, ZeroLengthSequence) {
  Buffers out = BuffersFor(valid_);
  const std::vector<int64_t> offsets{0, 3, 3, 8};
  core::AttentionInputs in = valid_.Inputs();
  in.query.offsets = offsets;
  ExpectRejected(in, out.outputs(), "query sequence 1");
}

TEST_F(ForwardValidationTest, DecreasingOffsets) {
  Buffers out = BuffersFor(valid_);
  const std::vector<int64_t> offsets{0, 6, 4, 8};
  core::AttentionInputs in = valid_.Inputs();
  in.query.offsets = offsets;
  ExpectRejected(in, out.outputs(), "query sequence 1");
}

TEST_F(ForwardValidationTest, NegativeOffsets) {
  Buffers out = BuffersFor(valid_);
  const std::vector<int64_t> offsets{0, -3, 8};
  core::AttentionInputs in = valid_.Inputs();
  in.query.offsets = offsets;
  ExpectRejected(in, out.outputs(), "query sequence 0");
}

TEST_F(ForwardValidationTest, OffsetsPastTheData) {
  Buffers out = BuffersFor(valid_);
  const std::vector<int64_t> offsets{0, 3, 9};
  core::AttentionInputs in = valid_.Inputs();
  in.query.offsets = offsets;
  ExpectRejected(in, out.outputs(), "query.data");
}

// Offsets so large that rows·d_model does not fit in int64: validation must not be fooled by
// the wrapped product into accepting an empty buffer for 2^61 rows. Checked on ValidateBatch
// directly, because if validation accepts this, Forward() would run over 2^61 rows of nothing.
TEST_F(ForwardValidationTest, OffsetsWhoseRowCountOverflowsTheDataSize) {
  const std::vector<int64_t> offsets{0, int64_t{1} << 61};  // 2^61 · 16 wraps to 0.
  core::AttentionInputs in;
  in.query = {.data = {}, .offsets = offsets};
  const absl::Status status = core::ValidateBatch(layer_.config, in, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("query"));
}

// The same inputs through Forward(): it must return InvalidArgument, not crash. Run in a child
// process (EXPECT_EXIT) so that a crash is reported as a failure of this test alone.
TEST_F(ForwardValidationTest, ForwardWithOverflowingOffsetsDoesNotCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<int64_t> offsets{0, int64_t{1} << 61};
  core::AttentionInputs in;
  in.query = {.data = {}, .offsets = offsets};
  EXPECT_EXIT(
      {
        const absl::Status status = executor_.Forward(*layer_.layer, in, {});
        std::exit(status.code() == absl::StatusCode::kInvalidArgument ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(ForwardValidationTest, MemoryWithDifferentSequenceCount) {
  TestBatch cross = MakeBatch(kDModel, {3, 5}, {4, 6, 2}, 13);
  Buffers out = BuffersFor(valid_);  // Sized for the query; the error is the memory's count.
  core::AttentionInputs in = cross.Inputs();
  out.weights.clear();
  ExpectRejected(in, out.outputs(), "memory");
}

TEST_F(ForwardValidationTest, MemoryWithZeroLengthSequence) {
  TestBatch cross = MakeBatch(kDModel, {3, 5}, {4, 6}, 13);
  const std::vector<int64_t> memory_offsets{0, 0, 10};
  core::AttentionInputs in = cross.Inputs();
  in.memory->offsets = memory_offsets;
  Buffers out = BuffersFor(valid_);
  out.weights.clear();
  ExpectRejected(in, out.outputs(), "memory sequence 0");
}

TEST_F(ForwardValidationTest, MemoryDataSizeMismatch) {
  TestBatch cross = MakeBatch(kDModel, {3, 5}, {4, 6}, 13);
  core::AttentionInputs in = cross.Inputs();
  in.memory->data = in.memory->data.first(in.memory->data.size() - kDModel);
  Buffers out = BuffersFor(cross);
  ExpectRejected(in, out.outputs(), "memory.data");
}

TEST_F(ForwardValidationTest, ExplicitMaskOneEntryShort) {
  Buffers out = BuffersFor(valid_);
  core::AttentionInputs in = valid_.Inputs();
  in.mask.explicit_mask = in.mask.explicit_mask.first(in.mask.explicit_mask.size() - 1);
  ExpectRejected(in, out.outputs(), "explicit_mask");
}

TEST_F(ForwardValidationTest, ExplicitMaskSizedForSelfAttentionInCrossAttention) {
  // T_i·T_i entries where T_i·S_i are needed.
  TestBatch cross = MakeBatch(kDModel, {3, 5}, {4, 6}, 13);
  cross.explicit_mask.assign(3 * 3 + 5 * 5, 1);
  Buffers out = BuffersFor(cross);
  ExpectRejected(cross.Inputs(), out.outputs(), "explicit_mask");
}

TEST_F(ForwardValidationTest, HeadMaskWithWrongSize) {
  Buffers out = BuffersFor(valid_);
  TestBatch batch = MakeBatch(kDModel, {3, 5}, {}, 9);
  SetHeadMask(batch, {true, false, true});  // 3 flags for 4 heads.
  ExpectRejected(batch.Inputs(), out.outputs(), "head_mask");
  SetHeadMask(batch, {true, false, true, true, true});
  ExpectRejected(batch.Inputs(), out.outputs(), "head_mask");
}

TEST_F(ForwardValidationTest, OutputTooSmall) {
  Buffers out = BuffersFor(valid_);
  out.output.pop_back();
  ExpectRejected(valid_.Inputs(), out.outputs(), "output");
}

TEST_F(ForwardValidationTest, OutputTooLarge) {
  Buffers out = BuffersFor(valid_);
  out.output.resize(out.output.size() + kDModel);
  ExpectRejected(valid_.Inputs(), out.outputs(), "output");
}

TEST_F(ForwardValidationTest, OutputMissing) {
  Buffers out = BuffersFor(valid_);
  out.output.clear();
  ExpectRejected(valid_.Inputs(), out.outputs(), "output");
}

TEST_F(ForwardValidationTest, WeightsOneShort) {
  Buffers out = BuffersFor(valid_);
  out.weights.pop_back();
  ExpectRejected(valid_.Inputs(), out.outputs(), "weights");
}

TEST_F(ForwardValidationTest, WeightsSizedForOneHead) {
  Buffers out = BuffersFor(valid_);
  out.weights.resize(out.weights.size() / kHeads);
  ExpectRejected(valid_.Inputs(), out.outputs(), "weights");
}

TEST_F(ForwardValidationTest, InputsForAnotherModelWidth) {
  // A batch built for d_model 8 against a d_model 16 layer: the data does not fit.
  TestBatch narrow = MakeBatch(8, {3, 5}, {}, 9);
  Buffers out = BuffersFor(valid_);
  ExpectRejected(narrow.Inputs(), out.outputs(), "query.data");
}

TEST_F(ForwardValidationTest, ValidCallsStillSucceedAfterManyErrors) {
  Buffers out = BuffersFor(valid_);
  core::AttentionInputs bad = valid_.Inputs();
  bad.query.data = bad.query.data.first(1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(executor_.Forward(*layer_.layer, bad, out.outputs()).code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Another valid shape, never seen before, after the errors.
  TestBatch other = MakeBatch(kDModel, {7, 7, 2}, {5, 5, 9}, 77);
  ExpectMatchesReference(executor_, *layer_.layer, layer_.weights, other);
}

TEST_F(ForwardValidationTest, NonFiniteQueryValueNamesSequenceRowAndColumn) {
  Buffers out = BuffersFor(valid_);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> data = valid_.query_data;
    data[4 * kDModel + 7] = bad;  // Row 4 is the second row of sequence 1 (lengths 3, 5).
    core::AttentionInputs in = valid_.Inputs();
    in.query.data = data;
    ExpectRejected(in, out.outputs(), "query.data[71] (sequence 1, row 4, column 7)");
  }
}

TEST_F(ForwardValidationTest, NonFiniteMemoryValue) {
  TestBatch cross = MakeBatch(kDModel, {3, 5}, {4, 2}, 12);
  Buffers out = BuffersFor(cross);
  std::vector<float> memory = cross.memory_data;
  memory.back() = std::numeric_limits<float>::quiet_NaN();
  core::AttentionInputs in = cross.Inputs();
  in.memory->data = memory;
  ExpectRejected(in, out.outputs(), "memory.data[95] (sequence 1, row 5, column 15)");
}

TEST_F(ForwardValidationTest, OverflowingScoresAreOutOfRangeNotNaN) {
  // Finite but huge inputs: fp32 Q·Kᵀ overflows to ∞ and the softmax would yield NaN.
  Buffers out = BuffersFor(valid_);
  std::vector<float> data = valid_.query_data;
  for (float& x : data) x *= 1e20f;
  core::AttentionInputs in = valid_.Inputs();
  in.query.data = data;
  const absl::Status status = executor_.Forward(*layer_.layer, in, out.outputs());
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("not finite"));
  ExpectMatchesReference(executor_, *layer_.layer, layer_.weights, valid_);
}

TEST(ValidateBatchTest, InvalidConfigIsAnErrorNotACrash) {
  const TestBatch batch = MakeBatch(kDModel, {3}, {}, 1);
  std::vector<float> output(3 * kDModel);
  const absl::Status status =
      core::ValidateBatch({.d_model = 0, .num_heads = 1}, batch.Inputs(), {.output = output});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("d_model"));
}

}  // namespace
}  // namespace attnserve::testing
