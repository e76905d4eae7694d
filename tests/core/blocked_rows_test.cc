// Query rows whose keys are all blocked by the explicit mask (alone or ANDed with causal): their
// attention weights are exactly zero and their output is exactly b_O (multi-head with bias) or
// exactly zero (single-head) — never NaN.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_executor.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {
namespace {

using core::AttentionConfig;
using core::AttentionVariant;

// A (sequence, query row) whose mask row is cleared.
struct BlockedRow {
  int64_t sequence, row;
};

// Per-sequence offset (Σ T·S before it) into the explicit mask.
int64_t MaskOffset(const TestBatch& batch, int64_t sequence) {
  int64_t offset = 0;
  for (int64_t i = 0; i < sequence; ++i) offset += batch.query_length(i) * batch.key_length(i);
  return offset;
}

void BlockRows(TestBatch& batch, const std::vector<BlockedRow>& rows) {
  for (const BlockedRow& b : rows) {
    const int64_t s = batch.key_length(b.sequence);
    uint8_t* row = batch.explicit_mask.data() + MaskOffset(batch, b.sequence) + b.row * s;
    std::fill(row, row + s, 0);
  }
}

// Checks the blocked rows of `result` exactly, everything else against the reference, and
// that nothing anywhere is NaN.
void ExpectBlockedRows(core::AttentionExecutor& executor, const TestLayer& layer,
                       const TestBatch& batch, const std::vector<BlockedRow>& blocked) {
  const AttentionConfig& config = layer.config;
  const int64_t d = config.d_model, h = config.num_heads;
  const ForwardResult result = RunForward(executor, *layer.layer, batch, /*with_weights=*/true);
  ASSERT_TRUE(result.status.ok()) << result.status;
  for (float v : result.output) ASSERT_FALSE(std::isnan(v));
  for (float v : result.weights) ASSERT_FALSE(std::isnan(v));

  for (const BlockedRow& b : blocked) {
    SCOPED_TRACE(::testing::Message() << "sequence " << b.sequence << " row " << b.row);
    const int64_t t = batch.query_length(b.sequence), s = batch.key_length(b.sequence);
    const float* out = result.output.data() + (batch.query_offsets[b.sequence] + b.row) * d;
    for (int64_t j = 0; j < d; ++j) {
      const float expected =
          config.HasOutputProjection() && config.bias ? layer.weights.b_o[j] : 0.0f;
      ASSERT_EQ(out[j], expected) << "output feature " << j;
    }
    const float* weights = result.weights.data() + h * MaskOffset(batch, b.sequence);
    for (int64_t head = 0; head < h; ++head) {
      for (int64_t key = 0; key < s; ++key) {
        ASSERT_EQ(weights[(head * t + b.row) * s + key], 0.0f) << "head " << head << " key " << key;
      }
    }
  }
  ExpectMatchesReference(executor, *layer.layer, layer.weights, batch);
}

class BlockedRowsTest : public ::testing::TestWithParam<AttentionConfig> {};

TEST_P(BlockedRowsTest, SelfAttentionExplicitMask) {
  const TestLayer layer = MakeTestLayer(GetParam(), 11);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(GetParam().d_model, {5, 9, 1}, {}, 12);
  SetRandomMask(batch, 0.8, 13);
  const std::vector<BlockedRow> blocked{{0, 0}, {0, 3}, {1, 8}, {2, 0}};
  BlockRows(batch, blocked);
  core::AttentionExecutor executor;
  ExpectBlockedRows(executor, layer, batch, blocked);
}

TEST_P(BlockedRowsTest, ExplicitMaskOpenOnlyOnFutureKeysIsBlockedByCausal) {
  const TestLayer layer = MakeTestLayer(GetParam(), 21);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(GetParam().d_model, {6, 6}, {}, 22);
  batch.causal = true;
  SetRandomMask(batch, 0.9, 23);
  // Rows 2 (sequence 0) and 4 (sequence 1) may only see keys after themselves: every key is
  // blocked by explicit AND causal, although neither mask alone blocks the whole row.
  std::vector<BlockedRow> blocked{{0, 2}, {1, 4}};
  for (const BlockedRow& b : blocked) {
    uint8_t* row = batch.explicit_mask.data() + MaskOffset(batch, b.sequence) + b.row * 6;
    for (int64_t key = 0; key < 6; ++key) row[key] = key > b.row ? 1 : 0;
  }
  core::AttentionExecutor executor;
  ExpectBlockedRows(executor, layer, batch, blocked);
}

TEST_P(BlockedRowsTest, CrossAttention) {
  const TestLayer layer = MakeTestLayer(GetParam(), 31);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(GetParam().d_model, {4, 7}, {9, 2}, 32);
  SetRandomMask(batch, 0.7, 33);
  const std::vector<BlockedRow> blocked{{0, 1}, {1, 0}, {1, 6}};
  BlockRows(batch, blocked);
  core::AttentionExecutor executor;
  ExpectBlockedRows(executor, layer, batch, blocked);
}

TEST_P(BlockedRowsTest, InsideRowTiles) {
  // Tiles of a few query rows: blocked rows at the start, middle and end of tiles.
  const TestLayer layer = MakeTestLayer(GetParam(), 41);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(GetParam().d_model, {120, 120, 120}, {}, 42);
  batch.causal = true;
  SetRandomMask(batch, 0.8, 43);
  const std::vector<BlockedRow> blocked{{0, 0}, {0, 57}, {1, 58}, {1, 119}, {2, 1}};
  BlockRows(batch, blocked);
  core::AttentionExecutor executor({.score_tile_bytes = 16 * 1024});
  ExpectBlockedRows(executor, layer, batch, blocked);
}

TEST_P(BlockedRowsTest, EveryRowBlocked) {
  const TestLayer layer = MakeTestLayer(GetParam(), 51);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(GetParam().d_model, {3, 2}, {}, 52);
  batch.explicit_mask.assign(static_cast<size_t>(batch.score_elements()), 0);
  std::vector<BlockedRow> blocked;
  for (int64_t i = 0; i < batch.num_sequences(); ++i) {
    for (int64_t r = 0; r < batch.query_length(i); ++r) blocked.push_back({i, r});
  }
  core::AttentionExecutor executor;
  ExpectBlockedRows(executor, layer, batch, blocked);
}

INSTANTIATE_TEST_SUITE_P(
    Layers, BlockedRowsTest,
    ::testing::Values(
        AttentionConfig{.d_model = 16, .num_heads = 4, .bias = true},
        AttentionConfig{.d_model = 16, .num_heads = 4, .bias = false},
        AttentionConfig{
            .d_model = 16, .num_heads = 1, .variant = AttentionVariant::kSingleHead, .bias = false},
        AttentionConfig{
            .d_model = 16, .num_heads = 1, .variant = AttentionVariant::kSingleHead, .bias = true}),
    [](const ::testing::TestParamInfo<AttentionConfig>& case_info) {
      const AttentionConfig& c = case_info.param;
      return absl::StrCat(c.variant == AttentionVariant::kMultiHead ? "MultiHead" : "SingleHead",
                          c.bias ? "WithBias" : "NoBias");
    });

}  // namespace
}  // namespace attnserve::testing
