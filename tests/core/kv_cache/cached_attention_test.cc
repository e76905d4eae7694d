// CachedAttentionExecutor against one full forward of the whole sequence (plain executor):
// chunked prefill and one-token decode steps, mixed batches, masks, head masks, weights and
// cross-attention over a memory loaded once. Every comparison: max abs difference ≤ 1e-5.
#include "core/kv_cache/cached_attention.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"
#include "tests/core/kv_cache/kv_test_support.h"

namespace attnserve::testing {
namespace {

using core::CachedAttentionExecutor;
using core::CachedAttentionInputs;
using core::KvSequence;

constexpr double kExact = 1e-5;
constexpr int64_t kD = 32;
constexpr int64_t kPoolBytes = 8 << 20;

core::AttentionConfig Config(bool single_head, bool bias) {
  return KvTestConfig(kD, single_head, bias, core::ComputeType::kFloat32);
}

std::unique_ptr<core::KvBlockPool> MakePool(const core::AttentionConfig& config) {
  return MakeTestPool(config, kPoolBytes);
}

class IncrementalExactnessTest : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(IncrementalExactnessTest, ChunksAndDecodeStepsEqualOneCausalForward) {
  const ChunkCase c = GetParam();
  const TestLayer layer = MakeTestLayer(Config(c.single_head, c.bias), 11);
  ASSERT_NE(layer.layer, nullptr);
  constexpr int64_t kRows = 130;  // Crosses 8 block boundaries.
  const std::vector<float> x = UniformValues(kRows * kD, 5);
  const std::vector<float> full = FullForward(*layer.layer, x, /*causal=*/true);
  EXPECT_LE(
      MaxAbsDiff(Incremental(*layer.layer, *MakePool(layer.config), x, c.chunk, c.chunk), full),
      kExact)
      << "chunks of " << c.chunk;
  EXPECT_LE(MaxAbsDiff(Incremental(*layer.layer, *MakePool(layer.config), x, c.chunk, 1), full),
            kExact)
      << "prefill " << c.chunk << " then one-token steps";
}

INSTANTIATE_TEST_SUITE_P(Chunks, IncrementalExactnessTest, ::testing::ValuesIn(ChunkCases()),
                         ChunkCaseName);

// Decode, prefill, chunked prefill and an uncached sequence in one batch equal each alone.
TEST(CachedAttentionTest, MixedBatchEqualsEachSequenceAlone) {
  const TestLayer layer = MakeTestLayer(Config(false, true), 3);
  ASSERT_NE(layer.layer, nullptr);
  auto pool = MakePool(layer.config);
  // Per sequence: cached tokens before the step (-1: no cache) and new rows.
  const std::vector<int64_t> past{20, 0, 33, -1, 47};
  const std::vector<int64_t> rows{1, 7, 5, 6, 1};
  const MixedBatch batch = RunMixedBatch(*layer.layer, *pool, past, rows);
  for (size_t i = 0; i < past.size(); ++i) {
    const int64_t p = std::max<int64_t>(past[i], 0);
    const std::vector<float> full = FullForward(*layer.layer, batch.xs[i], true);
    const std::span<const float> got(batch.out.data() + batch.offsets[i] * kD, rows[i] * kD);
    EXPECT_LE(MaxAbsDiff(got, std::span(full).subspan(p * kD)), kExact) << "sequence " << i;
    if (past[i] >= 0) {
      EXPECT_EQ(batch.seqs[i].length, p + rows[i]);
    }
  }
}

// The executor walks a forward's (sequence, head) items in alternate directions from one call to
// the next (to find more of the K/V still cached: Impl::backwards). The same decode batch run twice
// in a row, once each way, gives the same outputs, and each sequence's equals its own full forward.
TEST(CachedAttentionTest, ConsecutiveForwardsOfOneBatchAgree) {
  const TestLayer layer = MakeTestLayer(Config(false, true), 6);
  ASSERT_NE(layer.layer, nullptr);
  auto pool = MakePool(layer.config);
  core::CachedAttentionExecutor executor;
  const std::vector<int64_t> past{5, 17, 40};
  std::vector<std::vector<float>> xs;
  std::vector<KvSequence> seqs(past.size());
  std::vector<float> batch_x;
  std::vector<int64_t> offsets{0};
  std::vector<KvSequence*> caches;
  for (size_t i = 0; i < past.size(); ++i) {
    xs.push_back(UniformValues((past[i] + 1) * kD, 200 + i));
    std::vector<float> scratch(xs[i].size());
    ASSERT_TRUE(Step(executor, *layer.layer, *pool, seqs[i], xs[i], 0, past[i], scratch).ok());
    batch_x.insert(batch_x.end(), xs[i].end() - kD, xs[i].end());
    offsets.push_back(offsets.back() + 1);
    caches.push_back(&seqs[i]);
  }
  const CachedAttentionInputs in{
      .query = {batch_x, offsets}, .caches = caches, .mask = {.causal = true}};
  std::vector<std::vector<float>> outs;
  for (int run = 0; run < 2; ++run) {
    std::vector<float> out(batch_x.size(), NAN);
    ASSERT_TRUE(executor.Forward(*layer.layer, *pool, in, {.output = out}).ok()) << "run " << run;
    outs.push_back(out);
    for (size_t i = 0; i < past.size(); ++i) {  // Back to the cached prefix for the next run.
      pool->Commit(seqs[i], past[i]);
      pool->Trim(seqs[i]);
    }
  }
  EXPECT_EQ(outs[0], outs[1]);
  for (size_t i = 0; i < past.size(); ++i) {
    const std::vector<float> full = FullForward(*layer.layer, xs[i], /*causal=*/true);
    EXPECT_LE(
        MaxAbsDiff(std::span(outs[0]).subspan(i * kD, kD), std::span(full).subspan(past[i] * kD)),
        kExact)
        << "sequence " << i;
  }
  for (KvSequence& seq : seqs) pool->Release(seq);
}

// An explicit [T, P+T] mask, a head mask and the weights output of a cached step equal the last
// T rows of one full forward whose mask rows are the same.
TEST(CachedAttentionTest, ExplicitMaskHeadMaskAndWeightsMatchFullForward) {
  const TestLayer layer = MakeTestLayer(Config(false, false), 4);
  ASSERT_NE(layer.layer, nullptr);
  using M = MaskedStep;
  const MaskedStep run = RunMaskedStep(*layer.layer, *MakePool(layer.config));
  EXPECT_LE(MaxAbsDiff(run.step_out, std::span(run.full).subspan(M::kPast * kD)), kExact);
  for (int64_t head = 0; head < M::kHeads; ++head) {
    const std::span<const float> got(run.weights.data() + head * M::kNew * M::kAll,
                                     M::kNew * M::kAll);
    const std::span<const float> want(
        run.full_weights.data() + (head * M::kAll + M::kPast) * M::kAll, M::kNew * M::kAll);
    EXPECT_LE(MaxAbsDiff(got, want), kExact) << "head " << head;
  }
}

// A prefill longer than AttendRows' row tile (256), its last tile one row, with an explicit mask
// and the weights output, cached and uncached, equals one full forward.
TEST(CachedAttentionTest, LongPrefillInRowTilesMatchesFullForward) {
  const TestLayer layer = MakeTestLayer(Config(false, true), 14);
  ASSERT_NE(layer.layer, nullptr);
  constexpr int64_t kRows = 513, kHeads = 4;
  const std::vector<float> x = UniformValues(kRows * kD, 15);
  const std::vector<float> bits = UniformValues(kRows * kRows, 16);
  std::vector<uint8_t> mask(kRows * kRows);
  for (int64_t i = 0; i < kRows * kRows; ++i) mask[i] = bits[i] > -0.5f;
  std::fill(mask.begin() + 300 * kRows, mask.begin() + 301 * kRows, 0);  // A fully blocked row.
  std::vector<float> full_weights;
  const std::vector<float> full = FullForward(*layer.layer, x, true, {}, mask, {}, &full_weights);
  for (const bool cached : {true, false}) {
    auto pool = MakePool(layer.config);
    CachedAttentionExecutor executor;
    KvSequence seq;
    KvSequence* caches[] = {cached ? &seq : nullptr};
    const std::vector<int64_t> offsets{0, kRows};
    const CachedAttentionInputs in{
        .query = {x, offsets}, .caches = caches, .mask = {.causal = true, .explicit_mask = mask}};
    std::vector<float> out(x.size(), NAN), weights(kHeads * kRows * kRows, NAN);
    const absl::Status s =
        executor.Forward(*layer.layer, *pool, in, {.output = out, .weights = weights});
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_LE(MaxAbsDiff(out, full), kExact) << (cached ? "cached" : "uncached");
    EXPECT_LE(MaxAbsDiff(weights, full_weights), kExact) << (cached ? "cached" : "uncached");
  }
}

// Memory K/V loaded once; query steps of 1 and 3 rows equal one full cross-attention.
TEST(CachedAttentionTest, CrossAttentionStepsEqualFullCrossAttention) {
  for (bool single : {false, true}) {
    const TestLayer layer = MakeTestLayer(Config(single, true), 6);
    ASSERT_NE(layer.layer, nullptr);
    constexpr int64_t kMemory = 37, kQueries = 9;
    const std::vector<float> memory = UniformValues(kMemory * kD, 12);
    const std::vector<float> q = UniformValues(kQueries * kD, 13);
    const std::vector<float> full = FullForward(*layer.layer, q, false, memory);
    const std::vector<float> out =
        CrossAttentionSteps(*layer.layer, *MakePool(layer.config), memory, q);
    EXPECT_LE(MaxAbsDiff(out, full), kExact) << (single ? "single head" : "multi-head");
  }
}

}  // namespace
}  // namespace attnserve::testing
