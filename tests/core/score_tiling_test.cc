// The executor's score tiling: with a small ExecutorOptions::score_tile_bytes, long sequences are
// attended per head in blocks of query rows (ExecutorOptions::head_tile_bytes, set small here so
// that a head takes several blocks, shared out over the OpenMP threads), and short equal-length
// sequences several per tile. Results, including the weights output, must match the reference
// for every mask kind.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/forward/attention_executor.h"
#include "core/forward/onednn_support.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {
namespace {

using core::AttentionConfig;
using core::AttentionVariant;

constexpr int64_t kSmallTile = 64 * 1024;  // 16384 scores: 6 rows of h = 8, S = 300.

struct TilingCase {
  AttentionConfig config = {};
  std::vector<int64_t> query = {}, memory = {};
  bool causal = false;
  bool explicit_mask = false;
  bool head_mask = false;
  int64_t tile_bytes = kSmallTile;
};

void RunTilingCase(const TilingCase& c, uint64_t seed) {
  const TestLayer layer = MakeTestLayer(c.config, seed);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(c.config.d_model, c.query, c.memory, seed + 1);
  batch.causal = c.causal;
  if (c.explicit_mask) SetRandomMask(batch, 0.6, seed + 2);
  if (c.head_mask) {
    std::vector<bool> enabled;
    for (int64_t h = 0; h < c.config.num_heads; ++h) enabled.push_back(h % 2 == 0);
    SetHeadMask(batch, enabled);
  }
  core::AttentionExecutor executor({.score_tile_bytes = c.tile_bytes,
                                    .head_tile_bytes = std::max<int64_t>(1, c.tile_bytes / 4)});
  ExpectMatchesReference(executor, *layer.layer, layer.weights, batch);

  // The tiled result agrees with an executor whose tiles hold whole sequences.
  core::AttentionExecutor untiled({.score_tile_bytes = int64_t{1} << 30});
  const ForwardResult tiled = RunForward(executor, *layer.layer, batch, true);
  const ForwardResult whole = RunForward(untiled, *layer.layer, batch, true);
  ASSERT_TRUE(tiled.status.ok()) << tiled.status;
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  std::vector<double> whole_output(whole.output.begin(), whole.output.end());
  std::vector<double> whole_weights(whole.weights.begin(), whole.weights.end());
  EXPECT_TRUE(NearReference(tiled.output, whole_output, "tiled vs untiled output"));
  EXPECT_TRUE(NearReference(tiled.weights, whole_weights, "tiled vs untiled weights"));
}

// bf16 compute through the per-head tiles (bf16 probabilities from the fused softmax): within the
// bf16 bounds of the reference, exact zeros where it is zero.
TEST(ScoreTilingTest, Bf16PerHeadTilesWithinBf16Bounds) {
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  AttentionConfig config{.d_model = 64, .num_heads = 8, .bias = true};
  config.compute_type = core::ComputeType::kBFloat16;
  const TestLayer layer = MakeTestLayer(config, 11);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(config.d_model, {300, 517}, {}, 12);
  batch.causal = true;
  SetRandomMask(batch, 0.6, 13);
  core::AttentionExecutor executor(
      {.score_tile_bytes = kSmallTile, .head_tile_bytes = kSmallTile / 4});
  ExpectBf16NearReference(executor, *layer.layer, layer.weights, batch);
}

TEST(ScoreTilingTest, LongSelfAttentionCausal) {
  RunTilingCase({.config = {.d_model = 64, .num_heads = 8, .bias = true},
                 .query = {300, 517},
                 .causal = true},
                1);
}

TEST(ScoreTilingTest, LongSelfAttentionExplicit) {
  RunTilingCase({.config = {.d_model = 64, .num_heads = 8},
                 .query = {517, 300, 1, 300},
                 .explicit_mask = true},
                2);
}

TEST(ScoreTilingTest, LongSelfAttentionExplicitAndCausalWithHeadMask) {
  RunTilingCase({.config = {.d_model = 64, .num_heads = 8, .bias = true},
                 .query = {400, 3, 400},
                 .causal = true,
                 .explicit_mask = true,
                 .head_mask = true},
                3);
}

TEST(ScoreTilingTest, LongCrossAttentionWithLongerMemory) {
  RunTilingCase({.config = {.d_model = 64, .num_heads = 4},
                 .query = {300, 129},
                 .memory = {700, 40},
                 .causal = true,
                 .explicit_mask = true},
                4);
}

TEST(ScoreTilingTest, LongCausalCrossAttentionWithShorterMemory) {
  // S < T: past row S - 1 every query sees every key, inside and across tiles.
  RunTilingCase({.config = {.d_model = 64, .num_heads = 8},
                 .query = {300, 301},
                 .memory = {50, 50},
                 .causal = true},
                5);
}

TEST(ScoreTilingTest, SingleHeadVariant) {
  RunTilingCase({.config = {.d_model = 64,
                            .num_heads = 1,
                            .variant = AttentionVariant::kSingleHead,
                            .bias = true},
                 .query = {450, 2},
                 .causal = true,
                 .explicit_mask = true,
                 .tile_bytes = 16 * 1024},
                6);
}

TEST(ScoreTilingTest, TileSmallerThanOneRowAttendsRowByRow) {
  RunTilingCase({.config = {.d_model = 16, .num_heads = 2, .bias = true},
                 .query = {40, 7},
                 .causal = true,
                 .explicit_mask = true,
                 .tile_bytes = 4},
                7);
}

TEST(ScoreTilingTest, SeveralEqualSequencesPerTile) {
  // h·T·S·4 = 2·17·17·4 = 2312 bytes per sequence: two sequences per 5000-byte tile, so five
  // equal sequences run as tiles of 2, 2 and 1.
  RunTilingCase({.config = {.d_model = 16, .num_heads = 2},
                 .query = {17, 17, 17, 17, 17, 4},
                 .causal = true,
                 .explicit_mask = true,
                 .tile_bytes = 5000},
                8);
}

TEST(ScoreTilingTest, SeveralEqualCrossSequencesPerTile) {
  RunTilingCase({.config = {.d_model = 16, .num_heads = 2, .bias = true},
                 .query = {17, 17, 17, 17, 17},
                 .memory = {9, 9, 9, 9, 9},
                 .explicit_mask = true,
                 .head_mask = true,
                 .tile_bytes = 4000},
                9);
}

}  // namespace
}  // namespace attnserve::testing
