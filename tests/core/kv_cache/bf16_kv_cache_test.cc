// The paged KV cache of a bf16-compute model: its pool stores K and V in bf16 (round trip, ties to
// even, budget in bf16 block bytes, identity refusals), and its cached forwards — chunked prefill,
// one-token decode steps, mixed batches, masks, head masks and weights, cross-attention — stay
// within the bf16 bounds of the double-precision reference and of one full bf16 forward of the
// whole sequence.
//
// The bound (kBf16OutputBound · RMS, tests/core/attention_test_support.h) is the one every bf16
// test of the core uses: bf16 keeps 8 significant bits, so each rounded operand (input, Q, K, V,
// context, weights) carries a relative error ≤ 2^-9 and the sweep's worst output error is
// 0.09·RMS. The cached forward rounds exactly the operands the full bf16 forward rounds (inputs;
// Q, K and V after the projection; the context before W_O), so its error against the reference is
// of the same size; against the full bf16 forward it differs only where the full forward also
// rounds the probabilities to bf16 (the cache keeps them f32) and in f32 summation order.
// Measured (printed per case): cached vs reference ≤ 0.033·RMS, cached vs full bf16 ≤ 0.023·RMS,
// full bf16 vs reference ≤ 0.033·RMS. A second, tighter check says caching costs no accuracy: the
// cached error against the reference stays within 1.5× the full bf16 forward's own (measured
// ratio ≤ 1.1; ties in the bf16 rounding of K/V/context can go either way, hence the margin).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/forward/onednn_support.h"
#include "core/kv_cache/cached_attention.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"
#include "tests/core/kv_cache/kv_test_support.h"
#include "tests/reference/reference_attention.h"

namespace attnserve::testing::bf16_kv_cache_test {
namespace {

using core::AttentionConfig;
using core::CachedAttentionExecutor;
using core::CachedAttentionInputs;
using core::ComputeType;
using core::KvBlockPool;
using core::KvElementType;
using core::KvSequence;

constexpr int64_t kD = 32;
constexpr int64_t kPoolBytes = 4 << 20;  // As many bf16 blocks as the fp32 tests' 8 MiB.

AttentionConfig Bf16Config(bool single_head, bool bias) {
  return KvTestConfig(kD, single_head, bias, ComputeType::kBFloat16);
}

std::unique_ptr<KvBlockPool> MakePool(const AttentionConfig& config) {
  return MakeTestPool(config, kPoolBytes);
}

float Widen(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// ---- The pool ----------------------------------------------------------------------------------

TEST(Bf16KvBlockPoolTest, BlocksAreHalfTheBytesSoTheBudgetHoldsTwiceAsMany) {
  constexpr int64_t kFp32BlockBytes = 2 * 4 * 16 * 4;  // K, V × 4 tokens × d 16 × 4 bytes.
  AttentionConfig config{.d_model = 16, .num_heads = 2};
  auto fp32 =
      KvBlockPool::Create(config, {.block_tokens = 4, .budget_bytes = 10 * kFp32BlockBytes});
  config.compute_type = ComputeType::kBFloat16;
  auto bf16 =
      KvBlockPool::Create(config, {.block_tokens = 4, .budget_bytes = 10 * kFp32BlockBytes});
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  EXPECT_EQ((*fp32)->element_type(), KvElementType::kFloat32);
  EXPECT_EQ((*bf16)->element_type(), KvElementType::kBFloat16);
  EXPECT_EQ((*bf16)->block_elements(), (*fp32)->block_elements());
  EXPECT_EQ((*bf16)->block_bytes(), kFp32BlockBytes / 2);
  EXPECT_EQ((*fp32)->total_blocks(), 10);
  EXPECT_EQ((*bf16)->total_blocks(), 20);
  // A budget of one bf16 block (half an fp32 block) is enough for a bf16 pool only.
  EXPECT_TRUE(
      KvBlockPool::Create(config, {.block_tokens = 4, .budget_bytes = kFp32BlockBytes / 2}).ok());
  EXPECT_EQ(
      KvBlockPool::Create(config, {.block_tokens = 4, .budget_bytes = kFp32BlockBytes / 2 - 1})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(Bf16KvBlockPoolTest, WriteRoundsToNearestEvenAndReadsBackPerHead) {
  AttentionConfig config{.d_model = 16, .num_heads = 2, .compute_type = ComputeType::kBFloat16};
  auto pool = KvBlockPool::Create(config, {.block_tokens = 4, .budget_bytes = 1 << 16});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvSequence seq;
  ASSERT_TRUE((*pool)->Reserve(seq, 6).ok());  // Crosses a block.
  std::vector<float> k = UniformValues(6 * 16, 1), v = UniformValues(6 * 16, 2);
  // Exactly representable values survive; halfway cases go to the even neighbour.
  k[0] = 1.0f;
  k[1] = -3.5f;
  k[2] = 1.0f + 0x1p-8f;             // Halfway between 1 and 1 + 2^-7: to 1 (even).
  k[3] = 1.0f + 3 * 0x1p-8f;         // Halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6 (even).
  k[4] = 1.0f + 0x1p-8f + 0x1p-20f;  // Just above halfway: up.
  (*pool)->Write(seq, 6, k.data(), 16, v.data(), 16);
  (*pool)->Commit(seq, 6);
  auto cached_k = [&](int64_t t, int64_t c) {
    return Widen((*pool)->keys_bf16(seq.blocks[t / 4], c / 8)[(t % 4) * 8 + c % 8]);
  };
  EXPECT_EQ(cached_k(0, 0), 1.0f);
  EXPECT_EQ(cached_k(0, 1), -3.5f);
  EXPECT_EQ(cached_k(0, 2), 1.0f);
  EXPECT_EQ(cached_k(0, 3), 1.0f + 0x1p-6f);
  EXPECT_EQ(cached_k(0, 4), 1.0f + 0x1p-7f);
  for (int64_t t = 0; t < 6; ++t) {
    for (int64_t c = 0; c < 16; ++c) {
      const float want_k = k[t * 16 + c], want_v = v[t * 16 + c];
      const float got_v =
          Widen((*pool)->values_bf16(seq.blocks[t / 4], c / 8)[(t % 4) * 8 + c % 8]);
      // Round to nearest: within half a bf16 ulp (2^-8 relative).
      EXPECT_LE(std::fabs(cached_k(t, c) - want_k), std::fabs(want_k) * 0x1p-8f) << t << "," << c;
      EXPECT_LE(std::fabs(got_v - want_v), std::fabs(want_v) * 0x1p-8f) << t << "," << c;
    }
  }
  (*pool)->Release(seq);
  EXPECT_EQ((*pool)->free_blocks(), (*pool)->total_blocks());
}

TEST(Bf16KvBlockPoolTest, ACacheOfTheOtherComputeTypeIsRefused) {
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  AttentionConfig fp32_config{.d_model = kD, .num_heads = 4};
  const TestLayer bf16_layer = MakeTestLayer(Bf16Config(false, true), 1);
  const TestLayer fp32_layer = MakeTestLayer(fp32_config, 1);
  ASSERT_NE(bf16_layer.layer, nullptr);
  ASSERT_NE(fp32_layer.layer, nullptr);
  auto fp32_pool = MakePool(fp32_config);
  auto bf16_pool = MakePool(bf16_layer.config);
  CachedAttentionExecutor executor;
  const std::vector<float> x = UniformValues(3 * kD, 4);
  const std::vector<int64_t> offsets{0, 3};
  std::vector<float> out(x.size());
  for (auto [layer, pool] : {std::pair{bf16_layer.layer.get(), fp32_pool.get()},
                             std::pair{fp32_layer.layer.get(), bf16_pool.get()}}) {
    KvSequence seq;
    KvSequence* caches[] = {&seq};
    const CachedAttentionInputs in{.query = {x, offsets}, .caches = caches};
    const absl::Status s = executor.Forward(*layer, *pool, in, {.output = out});
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("compute type"), std::string::npos) << s;
    EXPECT_EQ(seq.length, 0);
    EXPECT_TRUE(seq.blocks.empty());
    EXPECT_EQ(pool->free_blocks(), pool->total_blocks());
    const std::vector<int64_t> mem_offsets{0, 3};
    EXPECT_EQ(executor.LoadMemory(*layer, *pool, {x, mem_offsets}, caches).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// ---- Forwards against the reference and the full bf16 forward ---------------------------------

// Output of the double-precision reference on one sequence (cross-attention with `memory`).
std::vector<double> Reference(const TestLayer& layer, std::span<const float> x, bool causal,
                              std::span<const float> memory = {}) {
  const std::vector<int64_t> offsets{0, static_cast<int64_t>(x.size()) / kD};
  const std::vector<int64_t> mem_offsets{0, static_cast<int64_t>(memory.size()) / kD};
  core::AttentionInputs in{.query = {x, offsets}, .mask = {.causal = causal}};
  if (!memory.empty()) in.memory = core::RaggedBatch{memory, mem_offsets};
  AttentionConfig config = layer.config;
  config.compute_type = ComputeType::kFloat32;  // The reference computes in double anyway.
  auto ref = reference::Attention(config, layer.weights, in);
  EXPECT_TRUE(ref.ok()) << ref.status();
  return ref.ok() ? ref->output : std::vector<double>(x.size(), 0.0);
}

// Checks `got` within kBf16OutputBound·RMS of the reference and of the full bf16 forward.
void ExpectWithinBf16Bounds(std::span<const float> got, std::span<const double> reference,
                            std::span<const float> full, const std::string& what) {
  const ErrorSummary vs_ref = SummariseError(got, reference);
  EXPECT_LE(vs_ref.max_abs_error, kBf16OutputBound * vs_ref.rms)
      << what << ": vs reference, RMS " << vs_ref.rms;
  const std::vector<double> full_double(full.begin(), full.end());
  const ErrorSummary vs_full = SummariseError(got, full_double);
  EXPECT_LE(vs_full.max_abs_error, kBf16OutputBound * vs_full.rms)
      << what << ": vs the full bf16 forward, RMS " << vs_full.rms;
  const ErrorSummary full_vs_ref = SummariseError(full, reference);
  EXPECT_LE(vs_ref.max_abs_error, 1.5 * full_vs_ref.max_abs_error)
      << what << ": the cache is less accurate than the full bf16 forward";
  std::printf(
      "%s: cached vs reference %.3g x RMS, vs full bf16 %.3g x RMS (full bf16 vs "
      "reference %.3g x RMS)\n",
      what.c_str(), vs_ref.max_abs_error / vs_ref.rms, vs_full.max_abs_error / vs_full.rms,
      full_vs_ref.max_abs_error / full_vs_ref.rms);
}

class Bf16IncrementalTest : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(Bf16IncrementalTest, ChunksAndDecodeStepsWithinBf16BoundsOfReferenceAndFullForward) {
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  const ChunkCase c = GetParam();
  const TestLayer layer = MakeTestLayer(Bf16Config(c.single_head, c.bias), 11);
  ASSERT_NE(layer.layer, nullptr);
  constexpr int64_t kRows = 130;  // Crosses 8 block boundaries.
  const std::vector<float> x = UniformValues(kRows * kD, 5);
  const std::vector<double> ref = Reference(layer, x, /*causal=*/true);
  const std::vector<float> full = FullForward(*layer.layer, x, /*causal=*/true);
  const std::string name = (c.single_head ? "single head" : "multi-head") +
                           std::string(c.bias ? " bias" : "") + " chunk " + std::to_string(c.chunk);
  ExpectWithinBf16Bounds(Incremental(*layer.layer, *MakePool(layer.config), x, c.chunk, c.chunk),
                         ref, full, name + ", chunks");
  ExpectWithinBf16Bounds(Incremental(*layer.layer, *MakePool(layer.config), x, c.chunk, 1), ref,
                         full, name + ", prefill then one-token steps");
}

INSTANTIATE_TEST_SUITE_P(Chunks, Bf16IncrementalTest, ::testing::ValuesIn(ChunkCases()),
                         ChunkCaseName);

// Decode, prefill and an uncached sequence (whose K/V the kernel reads from the f32 projection
// buffer, not the bf16 cache) in one batch: each within the bounds of its own full forward.
TEST(Bf16CachedAttentionTest, MixedBatchWithAnUncachedSequenceWithinBounds) {
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  const TestLayer layer = MakeTestLayer(Bf16Config(false, true), 3);
  ASSERT_NE(layer.layer, nullptr);
  auto pool = MakePool(layer.config);
  const std::vector<int64_t> past{20, 0, -1, 47};  // -1: no cache.
  const std::vector<int64_t> rows{1, 7, 6, 1};
  const MixedBatch batch = RunMixedBatch(*layer.layer, *pool, past, rows);
  for (size_t i = 0; i < past.size(); ++i) {
    const int64_t p = std::max<int64_t>(past[i], 0);
    const std::vector<double> ref = Reference(layer, batch.xs[i], true);
    const std::vector<float> full = FullForward(*layer.layer, batch.xs[i], true);
    ExpectWithinBf16Bounds(std::span(batch.out).subspan(batch.offsets[i] * kD, rows[i] * kD),
                           std::span(ref).subspan(p * kD), std::span(full).subspan(p * kD),
                           "mixed batch, sequence " + std::to_string(i));
  }
}

// An explicit mask with a fully blocked row, a head mask and the weights output of a bf16 cached
// step: output within the bounds of the full bf16 forward, weights within kBf16WeightsBound of
// its weights, each open row summing to 1 (the cache keeps the probabilities f32) and exact
// zeros for the blocked row and the disabled head.
TEST(Bf16CachedAttentionTest, ExplicitMaskHeadMaskAndWeightsWithinBounds) {
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  const TestLayer layer = MakeTestLayer(Bf16Config(false, false), 4);
  ASSERT_NE(layer.layer, nullptr);
  using M = MaskedStep;
  constexpr int64_t kPast = M::kPast, kNew = M::kNew, kAll = M::kAll, kHeads = M::kHeads;
  const MaskedStep run = RunMaskedStep(*layer.layer, *MakePool(layer.config));
  const std::vector<double> full_tail(run.full.begin() + kPast * kD, run.full.end());
  const ErrorSummary out = SummariseError(run.step_out, full_tail);
  EXPECT_LE(out.max_abs_error, kBf16OutputBound * out.rms) << "RMS " << out.rms;
  for (int64_t head = 0; head < kHeads; ++head) {
    for (int64_t j = 0; j < kNew; ++j) {
      const float* got = run.weights.data() + (head * kNew + j) * kAll;
      const float* want = run.full_weights.data() + (head * kAll + kPast + j) * kAll;
      double sum = 0, worst = 0;
      for (int64_t k = 0; k < kAll; ++k) {
        sum += got[k];
        worst = std::max(worst, std::fabs(double{got[k]} - want[k]));
        if (want[k] == 0.0f) {
          EXPECT_EQ(got[k], 0.0f) << "head " << head << " row " << j;
        }
      }
      EXPECT_LE(worst, kBf16WeightsBound) << "head " << head << " row " << j;
      const bool zero_row = !M::kHeadMask[head] || j == 1;
      EXPECT_NEAR(sum, zero_row ? 0.0 : 1.0, 1e-5) << "head " << head << " row " << j;
    }
  }
  for (int64_t c = 0; c < kD; ++c) {
    // Row 1 is fully blocked in every head: zero context, so with no bias a zero output.
    EXPECT_EQ(run.step_out[1 * kD + c], 0.0f) << c;
  }
}

// Memory K/V loaded once into the bf16 cache; query steps of 1 and 3 rows.
TEST(Bf16CachedAttentionTest, CrossAttentionStepsWithinBounds) {
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  for (bool single : {false, true}) {
    const TestLayer layer = MakeTestLayer(Bf16Config(single, true), 6);
    ASSERT_NE(layer.layer, nullptr);
    constexpr int64_t kMemory = 37, kQueries = 9;
    const std::vector<float> memory = UniformValues(kMemory * kD, 12);
    const std::vector<float> q = UniformValues(kQueries * kD, 13);
    const std::vector<double> ref = Reference(layer, q, false, memory);
    const std::vector<float> full = FullForward(*layer.layer, q, false, memory);
    const std::vector<float> out =
        CrossAttentionSteps(*layer.layer, *MakePool(layer.config), memory, q);
    ExpectWithinBf16Bounds(out, ref, full, single ? "cross, single head" : "cross, multi-head");
  }
}

}  // namespace
}  // namespace attnserve::testing::bf16_kv_cache_test
