// Helpers of the KV-cache tests (fp32 and bf16): one full (uncached) forward of a whole sequence
// with the plain AttentionExecutor, the test models and pools, the cached forwards the tests share
// (one step, a whole sequence in chunks, a mixed batch, a masked step with weights, cross-attention
// steps) and the max abs difference. Every cached helper reads d_model from the layer and fails the
// test (non-fatally) on an error status.
#ifndef ATTNSERVE_TESTS_CORE_KV_CACHE_KV_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_CORE_KV_CACHE_KV_TEST_SUPPORT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/forward/attention_executor.h"
#include "core/kv_cache/cached_attention.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {

// Largest |a[i] - b[i]|; +∞ when sizes differ.
inline double MaxAbsDiff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
  return worst;
}

// ‖got − want‖ / ‖want‖ (Euclidean, in double); +∞ when sizes differ.
inline double RelativeError(std::span<const float> got, std::span<const float> want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    norm += double{want[i]} * want[i];
  }
  return std::sqrt(diff / norm);
}

// One forward of the plain executor over one sequence `x` ([rows, d]); optional memory makes it
// cross-attention. Fails the test on error.
inline std::vector<float> FullForward(const core::AttentionLayer& layer, std::span<const float> x,
                                      bool causal, std::span<const float> memory = {},
                                      std::span<const uint8_t> mask = {},
                                      std::span<const bool> head_mask = {},
                                      std::vector<float>* weights = nullptr) {
  const int64_t d = layer.config().d_model;
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  const int64_t mem_rows = static_cast<int64_t>(memory.size()) / d;
  const std::vector<int64_t> offsets{0, rows}, mem_offsets{0, mem_rows};
  core::AttentionInputs in{.query = {x, offsets},
                           .mask = {.causal = causal, .explicit_mask = mask},
                           .head_mask = head_mask};
  if (!memory.empty()) in.memory = core::RaggedBatch{memory, mem_offsets};
  std::vector<float> out(x.size());
  if (weights != nullptr) weights->assign(core::WeightsSize(layer.config(), in), 0.0f);
  core::AttentionExecutor executor;
  const absl::Status s = executor.Forward(
      layer, in,
      {.output = out, .weights = weights ? std::span<float>(*weights) : std::span<float>()});
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Tokens per block of every test pool.
inline constexpr int64_t kTestBlockTokens = 16;

// A test model of width `d_model`: 4 heads, or one head of the single-head variant.
inline core::AttentionConfig KvTestConfig(int64_t d_model, bool single_head, bool bias,
                                          core::ComputeType compute_type) {
  core::AttentionConfig config =
      single_head ? core::AttentionConfig{.d_model = d_model,
                                          .num_heads = 1,
                                          .variant = core::AttentionVariant::kSingleHead,
                                          .bias = bias}
                  : core::AttentionConfig{.d_model = d_model, .num_heads = 4, .bias = bias};
  config.compute_type = compute_type;
  return config;
}

// A pool of kTestBlockTokens-token blocks within `budget_bytes`, sequences up to 4096 tokens;
// nullptr (and a test failure) if it cannot be made.
inline std::unique_ptr<core::KvBlockPool> MakeTestPool(const core::AttentionConfig& config,
                                                       int64_t budget_bytes) {
  auto pool = core::KvBlockPool::Create(config, {.block_tokens = kTestBlockTokens,
                                                 .budget_bytes = budget_bytes,
                                                 .max_sequence_tokens = 4096});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// One cached step of one sequence: rows [first, first + count) of x ([rows, d]) into the same rows
// of out.
inline absl::Status Step(core::CachedAttentionExecutor& executor, const core::AttentionLayer& layer,
                         core::KvBlockPool& pool, core::KvSequence& seq, std::span<const float> x,
                         int64_t first, int64_t count, std::span<float> out, bool causal = true) {
  const int64_t d = layer.config().d_model;
  const std::vector<int64_t> offsets{0, count};
  core::KvSequence* caches[] = {&seq};
  const core::CachedAttentionInputs in{.query = {x.subspan(first * d, count * d), offsets},
                                       .caches = caches,
                                       .mask = {.causal = causal}};
  return executor.Forward(layer, pool, in, {.output = out.subspan(first * d, count * d)});
}

// Runs the sequence x through one cache of `pool`, causal, with `first` rows, then chunks of
// `rest` rows; checks the cached length after every step and that releasing the sequence frees
// every block. Returns the output of every row (NaN where a step failed).
inline std::vector<float> Incremental(const core::AttentionLayer& layer, core::KvBlockPool& pool,
                                      std::span<const float> x, int64_t first, int64_t rest) {
  core::CachedAttentionExecutor executor;
  const int64_t rows = static_cast<int64_t>(x.size()) / layer.config().d_model;
  std::vector<float> out(x.size(), NAN);
  core::KvSequence seq;
  for (int64_t r = 0; r < rows;) {
    const int64_t n = std::min(r == 0 ? first : rest, rows - r);
    const absl::Status s = Step(executor, layer, pool, seq, x, r, n, out);
    EXPECT_TRUE(s.ok()) << s;
    r += n;
    EXPECT_EQ(seq.length, r);
  }
  pool.Release(seq);
  EXPECT_EQ(pool.free_blocks(), pool.total_blocks());
  return out;
}

// One case of the chunked-prefill tests: the model and the prefill chunk.
struct ChunkCase {
  bool single_head;
  bool bias;
  int64_t chunk;
};

// Every model (multi/single head × bias) with chunks 1, 3, a block -1/0/+1 and 100.
inline std::vector<ChunkCase> ChunkCases() {
  std::vector<ChunkCase> cases;
  for (bool single : {false, true}) {
    for (bool bias : {false, true}) {
      for (int64_t chunk : {int64_t{1}, int64_t{3}, kTestBlockTokens - 1, kTestBlockTokens,
                            kTestBlockTokens + 1, int64_t{100}}) {
        cases.push_back({single, bias, chunk});
      }
    }
  }
  return cases;
}

// The test name of a ChunkCase, e.g. MultiHeadBiasChunk16.
inline std::string ChunkCaseName(const ::testing::TestParamInfo<ChunkCase>& param_info) {
  return std::string(param_info.param.single_head ? "SingleHead" : "MultiHead") +
         (param_info.param.bias ? "Bias" : "NoBias") + "Chunk" +
         std::to_string(param_info.param.chunk);
}

// One batch mixing decode, prefill, chunked prefill and uncached sequences: sequence i has
// past[i] tokens cached beforehand (one step; -1: no cache) and rows[i] new rows in the batch.
struct MixedBatch {
  std::vector<std::vector<float>> xs;  // Sequence i's whole input, [past + rows, d], seed 100 + i.
  std::vector<core::KvSequence> seqs;  // Their caches (unused for past -1).
  std::vector<int64_t> offsets;        // Row offsets of the sequences' new rows in `out`.
  std::vector<float> out;              // The batch's output, [Σ rows, d].
};

// Fills the caches, then runs every sequence's new rows in one causal batch.
inline MixedBatch RunMixedBatch(const core::AttentionLayer& layer, core::KvBlockPool& pool,
                                const std::vector<int64_t>& past,
                                const std::vector<int64_t>& rows) {
  const int64_t d = layer.config().d_model;
  core::CachedAttentionExecutor executor;
  MixedBatch batch{
      .xs = {}, .seqs = std::vector<core::KvSequence>(past.size()), .offsets = {0}, .out = {}};
  std::vector<float> batch_x;
  std::vector<core::KvSequence*> caches;
  for (size_t i = 0; i < past.size(); ++i) {
    const int64_t p = std::max<int64_t>(past[i], 0);
    batch.xs.push_back(UniformValues((p + rows[i]) * d, 100 + i));
    const std::vector<float>& x = batch.xs.back();
    std::vector<float> scratch(x.size());
    if (past[i] > 0) {
      EXPECT_TRUE(Step(executor, layer, pool, batch.seqs[i], x, 0, p, scratch).ok());
    }
    batch_x.insert(batch_x.end(), x.begin() + p * d, x.end());
    batch.offsets.push_back(batch.offsets.back() + rows[i]);
    caches.push_back(past[i] < 0 ? nullptr : &batch.seqs[i]);
  }
  batch.out.assign(batch_x.size(), NAN);
  const core::CachedAttentionInputs in{
      .query = {batch_x, batch.offsets}, .caches = caches, .mask = {.causal = true}};
  EXPECT_TRUE(executor.Forward(layer, pool, in, {.output = batch.out}).ok());
  return batch;
}

// A cached step of kNew rows after kPast cached rows with an explicit [kNew, kAll] mask (row 1
// fully blocked), the head mask kHeadMask and the weights output, and one full forward of all
// kAll rows whose last kNew mask rows are the same. For a 4-head model.
struct MaskedStep {
  static constexpr int64_t kPast = 21, kNew = 4, kAll = kPast + kNew, kHeads = 4;
  static constexpr bool kHeadMask[kHeads] = {true, false, true, true};
  std::vector<float> full;          // The full forward's output, [kAll, d].
  std::vector<float> full_weights;  // Its weights, [kHeads, kAll, kAll].
  std::vector<float> step_out;      // The cached step's output, [kNew, d].
  std::vector<float> weights;       // Its weights, [kHeads, kNew, kAll] (NaN where not written).
};

inline MaskedStep RunMaskedStep(const core::AttentionLayer& layer, core::KvBlockPool& pool) {
  using M = MaskedStep;
  const int64_t d = layer.config().d_model;
  const std::vector<float> x = UniformValues(M::kAll * d, 9);
  std::vector<uint8_t> full_mask(M::kAll * M::kAll, 1);
  const std::vector<float> bits = UniformValues(M::kNew * M::kAll, 10);
  std::vector<uint8_t> step_mask(M::kNew * M::kAll);
  for (int64_t i = 0; i < M::kNew * M::kAll; ++i) step_mask[i] = bits[i] > -0.4f;
  std::fill(step_mask.begin() + M::kAll, step_mask.begin() + 2 * M::kAll, 0);  // Row 1 blocked.
  std::copy(step_mask.begin(), step_mask.end(), full_mask.begin() + M::kPast * M::kAll);
  MaskedStep run;
  run.full = FullForward(layer, x, true, {}, full_mask, M::kHeadMask, &run.full_weights);

  core::CachedAttentionExecutor executor;
  core::KvSequence seq;
  std::vector<float> prefix_out(x.size());
  EXPECT_TRUE(Step(executor, layer, pool, seq, x, 0, M::kPast, prefix_out).ok());
  const std::vector<int64_t> offsets{0, M::kNew};
  core::KvSequence* caches[] = {&seq};
  const core::CachedAttentionInputs in{.query = {std::span(x).subspan(M::kPast * d), offsets},
                                       .caches = caches,
                                       .mask = {.causal = true, .explicit_mask = step_mask},
                                       .head_mask = M::kHeadMask};
  run.step_out.assign(M::kNew * d, NAN);
  run.weights.assign(M::kHeads * M::kNew * M::kAll, NAN);
  const absl::Status s =
      executor.Forward(layer, pool, in, {.output = run.step_out, .weights = run.weights});
  EXPECT_TRUE(s.ok()) << s;
  return run;
}

// Cross-attention through one cache: loads `memory` ([S, d]) once, then runs the queries q in
// steps of one row (the first 6 rows) and then 3 rows; checks the cache stays at S tokens (it is
// read-only). Returns the output of every query row.
inline std::vector<float> CrossAttentionSteps(const core::AttentionLayer& layer,
                                              core::KvBlockPool& pool,
                                              std::span<const float> memory,
                                              std::span<const float> q) {
  const int64_t d = layer.config().d_model;
  const int64_t memory_rows = static_cast<int64_t>(memory.size()) / d;
  const int64_t rows = static_cast<int64_t>(q.size()) / d;
  core::CachedAttentionExecutor executor;
  core::KvSequence seq;
  core::KvSequence* caches[] = {&seq};
  const std::vector<int64_t> mem_offsets{0, memory_rows};
  EXPECT_TRUE(executor.LoadMemory(layer, pool, {memory, mem_offsets}, caches).ok());
  EXPECT_EQ(seq.length, memory_rows);
  std::vector<float> out(q.size(), NAN);
  for (int64_t r = 0; r < rows;) {
    const int64_t n = std::min<int64_t>(r < 6 ? 1 : 3, rows - r);
    const std::vector<int64_t> offsets{0, n};
    const core::CachedAttentionInputs in{
        .query = {q.subspan(r * d, n * d), offsets}, .caches = caches, .cross_attention = true};
    const absl::Status s =
        executor.Forward(layer, pool, in, {.output = std::span(out).subspan(r * d, n * d)});
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(seq.length, memory_rows) << "the memory cache is read-only";
    r += n;
  }
  return out;
}

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_CORE_KV_CACHE_KV_TEST_SUPPORT_H_
