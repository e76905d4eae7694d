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

using core::AttentionConfig;
using core::AttentionVariant;
using core::CachedAttentionExecutor;
using core::CachedAttentionInputs;
using core::KvBlockPool;
using core::KvSequence;

constexpr double kExact = 1e-5;
constexpr int64_t kD = 32;
constexpr int64_t kBlock = 16;

std::unique_ptr<KvBlockPool> MakePool(const AttentionConfig& config, int64_t max_tokens = 4096) {
  auto pool = KvBlockPool::Create(
      config, {.block_tokens = kBlock, .budget_bytes = 8 << 20, .max_sequence_tokens = max_tokens});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

AttentionConfig Config(bool single_head, bool bias) {
  return single_head ? AttentionConfig{.d_model = kD,
                                       .num_heads = 1,
                                       .variant = AttentionVariant::kSingleHead,
                                       .bias = bias}
                     : AttentionConfig{.d_model = kD, .num_heads = 4, .bias = bias};
}

// One cached step of one sequence: rows [first, first + count) of x.
absl::Status Step(CachedAttentionExecutor& executor, const core::AttentionLayer& layer,
                  KvBlockPool& pool, KvSequence& seq, std::span<const float> x, int64_t first,
                  int64_t count, std::span<float> out, bool causal = true) {
  const std::vector<int64_t> offsets{0, count};
  KvSequence* caches[] = {&seq};
  const CachedAttentionInputs in{.query = {x.subspan(first * kD, count * kD), offsets},
                                 .caches = caches,
                                 .mask = {.causal = causal}};
  return executor.Forward(layer, pool, in, {.output = out.subspan(first * kD, count * kD)});
}

struct ChunkCase {
  bool single_head;
  bool bias;
  int64_t chunk;
};

class IncrementalExactnessTest : public ::testing::TestWithParam<ChunkCase> {};

// Runs the sequence through the cache with `first` rows, then chunks of `rest` rows.
std::vector<float> Incremental(const core::AttentionLayer& layer, std::span<const float> x,
                               int64_t first, int64_t rest) {
  auto pool = MakePool(layer.config());
  CachedAttentionExecutor executor;
  const int64_t rows = static_cast<int64_t>(x.size()) / kD;
  std::vector<float> out(x.size(), NAN);
  KvSequence seq;
  for (int64_t r = 0; r < rows;) {
    const int64_t n = std::min(r == 0 ? first : rest, rows - r);
    const absl::Status s = Step(executor, layer, *pool, seq, x, r, n, out);
    EXPECT_TRUE(s.ok()) << s;
    r += n;
    EXPECT_EQ(seq.length, r);
  }
  pool->Release(seq);
  EXPECT_EQ(pool->free_blocks(), pool->total_blocks());
  return out;
}

TEST_P(IncrementalExactnessTest, ChunksAndDecodeStepsEqualOneCausalForward) {
  const ChunkCase c = GetParam();
  const TestLayer layer = MakeTestLayer(Config(c.single_head, c.bias), 11);
  ASSERT_NE(layer.layer, nullptr);
  constexpr int64_t kRows = 130;  // Crosses 8 block boundaries.
  const std::vector<float> x = UniformValues(kRows * kD, 5);
  const std::vector<float> full = FullForward(*layer.layer, x, /*causal=*/true);
  EXPECT_LE(MaxAbsDiff(Incremental(*layer.layer, x, c.chunk, c.chunk), full), kExact)
      << "chunks of " << c.chunk;
  EXPECT_LE(MaxAbsDiff(Incremental(*layer.layer, x, c.chunk, 1), full), kExact)
      << "prefill " << c.chunk << " then one-token steps";
}

std::vector<ChunkCase> ChunkCases() {
  std::vector<ChunkCase> cases;
  for (bool single : {false, true}) {
    for (bool bias : {false, true}) {
      for (int64_t chunk : {int64_t{1}, int64_t{3}, kBlock - 1, kBlock, kBlock + 1, int64_t{100}}) {
        cases.push_back({single, bias, chunk});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Chunks, IncrementalExactnessTest, ::testing::ValuesIn(ChunkCases()),
                         [](const auto& param_info) {
                           return std::string(param_info.param.single_head ? "SingleHead"
                                                                           : "MultiHead") +
                                  (param_info.param.bias ? "Bias" : "NoBias") + "Chunk" +
                                  std::to_string(param_info.param.chunk);
                         });

// Decode, prefill, chunked prefill and an uncached sequence in one batch equal each alone.
TEST(CachedAttentionTest, MixedBatchEqualsEachSequenceAlone) {
  const TestLayer layer = MakeTestLayer(Config(false, true), 3);
  ASSERT_NE(layer.layer, nullptr);
  auto pool = MakePool(layer.config);
  CachedAttentionExecutor executor;
  // Per sequence: cached tokens before the step (-1: no cache) and new rows.
  const std::vector<int64_t> past{20, 0, 33, -1, 47};
  const std::vector<int64_t> rows{1, 7, 5, 6, 1};
  std::vector<std::vector<float>> xs, fulls;
  std::vector<KvSequence> seqs(past.size());
  std::vector<float> batch_x;
  std::vector<int64_t> offsets{0};
  std::vector<KvSequence*> caches;
  for (size_t i = 0; i < past.size(); ++i) {
    const int64_t p = std::max<int64_t>(past[i], 0);
    xs.push_back(UniformValues((p + rows[i]) * kD, 100 + i));
    fulls.push_back(FullForward(*layer.layer, xs[i], true));
    std::vector<float> scratch(xs[i].size());
    if (past[i] > 0) {
      ASSERT_TRUE(Step(executor, *layer.layer, *pool, seqs[i], xs[i], 0, p, scratch).ok());
    }
    batch_x.insert(batch_x.end(), xs[i].begin() + p * kD, xs[i].end());
    offsets.push_back(offsets.back() + rows[i]);
    caches.push_back(past[i] < 0 ? nullptr : &seqs[i]);
  }
  std::vector<float> out(batch_x.size());
  const CachedAttentionInputs in{
      .query = {batch_x, offsets}, .caches = caches, .mask = {.causal = true}};
  ASSERT_TRUE(executor.Forward(*layer.layer, *pool, in, {.output = out}).ok());
  for (size_t i = 0; i < past.size(); ++i) {
    const int64_t p = std::max<int64_t>(past[i], 0);
    const std::span<const float> got(out.data() + offsets[i] * kD, rows[i] * kD);
    EXPECT_LE(MaxAbsDiff(got, std::span(fulls[i]).subspan(p * kD)), kExact) << "sequence " << i;
    if (past[i] >= 0) {
      EXPECT_EQ(seqs[i].length, p + rows[i]);
    }
  }
}

// An explicit [T, P+T] mask, a head mask and the weights output of a cached step equal the last
// T rows of one full forward whose mask rows are the same.
TEST(CachedAttentionTest, ExplicitMaskHeadMaskAndWeightsMatchFullForward) {
  const TestLayer layer = MakeTestLayer(Config(false, false), 4);
  ASSERT_NE(layer.layer, nullptr);
  constexpr int64_t kPast = 21, kNew = 4, kAll = kPast + kNew, kHeads = 4;
  const std::vector<float> x = UniformValues(kAll * kD, 9);
  std::vector<uint8_t> full_mask(kAll * kAll, 1);
  const std::vector<float> bits = UniformValues(kNew * kAll, 10);
  std::vector<uint8_t> step_mask(kNew * kAll);
  for (int64_t i = 0; i < kNew * kAll; ++i) step_mask[i] = bits[i] > -0.4f;
  std::fill(step_mask.begin() + kAll, step_mask.begin() + 2 * kAll, 0);  // A fully blocked row.
  std::copy(step_mask.begin(), step_mask.end(), full_mask.begin() + kPast * kAll);
  const bool head_mask[kHeads] = {true, false, true, true};
  std::vector<float> full_weights;
  const std::vector<float> full =
      FullForward(*layer.layer, x, true, {}, full_mask, head_mask, &full_weights);

  auto pool = MakePool(layer.config);
  CachedAttentionExecutor executor;
  KvSequence seq;
  std::vector<float> out(x.size());
  ASSERT_TRUE(Step(executor, *layer.layer, *pool, seq, x, 0, kPast, out).ok());
  const std::vector<int64_t> offsets{0, kNew};
  KvSequence* caches[] = {&seq};
  const CachedAttentionInputs in{.query = {std::span(x).subspan(kPast * kD), offsets},
                                 .caches = caches,
                                 .mask = {.causal = true, .explicit_mask = step_mask},
                                 .head_mask = head_mask};
  std::vector<float> step_out(kNew * kD), weights(kHeads * kNew * kAll, NAN);
  const absl::Status s =
      executor.Forward(*layer.layer, *pool, in, {.output = step_out, .weights = weights});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LE(MaxAbsDiff(step_out, std::span(full).subspan(kPast * kD)), kExact);
  for (int64_t head = 0; head < kHeads; ++head) {
    const std::span<const float> got(weights.data() + head * kNew * kAll, kNew * kAll);
    const std::span<const float> want(full_weights.data() + (head * kAll + kPast) * kAll,
                                      kNew * kAll);
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

    auto pool = MakePool(layer.config);
    CachedAttentionExecutor executor;
    KvSequence seq;
    KvSequence* caches[] = {&seq};
    const std::vector<int64_t> mem_offsets{0, kMemory};
    ASSERT_TRUE(executor.LoadMemory(*layer.layer, *pool, {memory, mem_offsets}, caches).ok());
    EXPECT_EQ(seq.length, kMemory);
    std::vector<float> out(q.size());
    for (int64_t r = 0; r < kQueries;) {
      const int64_t n = r < 6 ? 1 : 3;
      const std::vector<int64_t> offsets{0, n};
      const CachedAttentionInputs in{.query = {std::span(q).subspan(r * kD, n * kD), offsets},
                                     .caches = caches,
                                     .cross_attention = true};
      const absl::Status s = executor.Forward(*layer.layer, *pool, in,
                                              {.output = std::span(out).subspan(r * kD, n * kD)});
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(seq.length, kMemory) << "the memory cache is read-only";
      r += n;
    }
    EXPECT_LE(MaxAbsDiff(out, full), kExact) << (single ? "single head" : "multi-head");
  }
}

}  // namespace
}  // namespace attnserve::testing
