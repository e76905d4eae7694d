// AttentionInputs::head_mask: a disabled head contributes exact zeros (weights and head output),
// which for the multi-head variant is the same as zeroing that head's rows of W_O.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/forward/attention_executor.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {
namespace {

using core::AttentionConfig;
using core::AttentionVariant;

constexpr AttentionConfig kMultiHead{.d_model = 32, .num_heads = 4, .bias = true};

TEST(HeadMaskTest, DisabledHeadsHaveExactlyZeroWeights) {
  const TestLayer layer = MakeTestLayer(kMultiHead, 1);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(32, {6, 11}, {}, 2);
  batch.causal = true;
  SetHeadMask(batch, {true, false, true, false});
  core::AttentionExecutor executor;
  const ForwardResult result = RunForward(executor, *layer.layer, batch, true);
  ASSERT_TRUE(result.status.ok()) << result.status;

  int64_t offset = 0;
  for (int64_t n = 0; n < batch.num_sequences(); ++n) {
    const int64_t t = batch.query_length(n), s = batch.key_length(n);
    for (int64_t head = 0; head < 4; ++head) {
      for (int64_t i = 0; i < t; ++i) {
        const float* row = result.weights.data() + offset + (head * t + i) * s;
        if (head % 2 == 1) {
          EXPECT_TRUE(std::all_of(row, row + s, [](float w) { return w == 0.0f; }))
              << "sequence " << n << " head " << head << " row " << i;
        } else {
          double sum = 0;
          for (int64_t j = 0; j < s; ++j) sum += row[j];
          EXPECT_NEAR(sum, 1.0, 1e-5) << "sequence " << n << " head " << head << " row " << i;
        }
      }
    }
    offset += 4 * t * s;
  }
  ExpectMatchesReference(executor, *layer.layer, layer.weights, batch);
}

TEST(HeadMaskTest, DisablingAHeadEqualsZeroingItsRowsOfTheOutputProjection) {
  const TestLayer layer = MakeTestLayer(kMultiHead, 3);
  ASSERT_NE(layer.layer, nullptr);
  // The same weights with head 2's rows [16, 24) of W_O zeroed.
  core::AttentionWeights pruned = layer.weights;
  std::fill(pruned.w_o.begin() + 16 * 32, pruned.w_o.begin() + 24 * 32, 0.0f);
  const auto pruned_layer = core::AttentionLayer::Create(kMultiHead, pruned);
  ASSERT_TRUE(pruned_layer.ok()) << pruned_layer.status();

  TestBatch masked = MakeBatch(32, {9, 4, 20}, {}, 4);
  SetRandomMask(masked, 0.8, 5);
  SetHeadMask(masked, {true, true, false, true});
  TestBatch unmasked = MakeBatch(32, {9, 4, 20}, {}, 4);
  unmasked.explicit_mask = masked.explicit_mask;

  core::AttentionExecutor executor;
  const ForwardResult a = RunForward(executor, *layer.layer, masked, false);
  const ForwardResult b = RunForward(executor, **pruned_layer, unmasked, false);
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_TRUE(NearReference(a.output, std::vector<double>(b.output.begin(), b.output.end()),
                            "head-masked vs W_O-pruned"));
}

TEST(HeadMaskTest, AllHeadsDisabledLeavesOnlyTheOutputBias) {
  const TestLayer layer = MakeTestLayer(kMultiHead, 6);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(32, {5, 3}, {7, 2}, 7);
  SetHeadMask(batch, {false, false, false, false});
  core::AttentionExecutor executor;
  const ForwardResult result = RunForward(executor, *layer.layer, batch, true);
  ASSERT_TRUE(result.status.ok()) << result.status;
  for (int64_t r = 0; r < batch.query_rows(); ++r) {
    for (int64_t j = 0; j < 32; ++j) {
      ASSERT_EQ(result.output[r * 32 + j], layer.weights.b_o[j]) << r << "," << j;
    }
  }
  EXPECT_TRUE(
      std::all_of(result.weights.begin(), result.weights.end(), [](float w) { return w == 0.0f; }));
}

TEST(HeadMaskTest, SingleHeadDisabledGivesZeroOutput) {
  const AttentionConfig config{
      .d_model = 16, .num_heads = 1, .variant = AttentionVariant::kSingleHead, .bias = true};
  const TestLayer layer = MakeTestLayer(config, 8);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(16, {5, 30}, {}, 9);
  batch.causal = true;
  SetHeadMask(batch, {false});
  core::AttentionExecutor executor;
  const ForwardResult result = RunForward(executor, *layer.layer, batch, true);
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_TRUE(
      std::all_of(result.output.begin(), result.output.end(), [](float v) { return v == 0.0f; }));
  EXPECT_TRUE(
      std::all_of(result.weights.begin(), result.weights.end(), [](float w) { return w == 0.0f; }));
}

TEST(HeadMaskTest, AllHeadsEnabledEqualsNoHeadMask) {
  const TestLayer layer = MakeTestLayer(kMultiHead, 10);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch with_mask = MakeBatch(32, {8, 8, 3}, {}, 11);
  with_mask.causal = true;
  SetHeadMask(with_mask, {true, true, true, true});
  TestBatch without_mask = MakeBatch(32, {8, 8, 3}, {}, 11);
  without_mask.causal = true;
  core::AttentionExecutor executor;
  const ForwardResult a = RunForward(executor, *layer.layer, with_mask, true);
  const ForwardResult b = RunForward(executor, *layer.layer, without_mask, true);
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.weights, b.weights);
}

}  // namespace
}  // namespace attnserve::testing
