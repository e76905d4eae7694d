// The int8 KV cache: QuantizeInt8Row's rounding and scale, the int8 pool's block bytes (the budget
// holds ~1.94× a bf16 pool's tokens), its block layout and Write, and the accuracy of decoding over
// it: the same 512 one-token steps over an int8 cache and over an fp32 cache of an fp32 model,
// compared step by step (outputs ‖y − y_fp32‖ / ‖y_fp32‖ and the attention weights' max abs
// difference), for head widths on the kernel's vector path (64) and its general loop (16). Chunked
// prefill, cross-attention memory and a bf16-compute model over an int8 cache stay within the same
// bounds of their full forward.
//
// Bounds, from the measurement printed by the tests: each K and V value is within half a step of
// 1/127 of its row's largest |value| (≤ 0.4 % of it), so scores move by ~0.2 % of their spread and
// outputs by a few 1e-3 relative. Measured over 512 steps (printed): outputs ≤ 5.9e-3 relative,
// worst in the first steps over few keys and 1.0-1.3e-3 by step 512; weights ≤ 1.2e-3 absolute.
// The tests hold them at kOutputBound and kWeightsBound.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/forward/onednn_support.h"
#include "core/kv_cache/cached_attention.h"
#include "core/kv_cache/int8_rows.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"
#include "tests/core/kv_cache/kv_test_support.h"

namespace attnserve::testing {
namespace {

using core::AttentionConfig;
using core::CachedAttentionExecutor;
using core::CachedAttentionInputs;
using core::ComputeType;
using core::Int8Scale;
using core::KvBlockPool;
using core::KvElementType;
using core::KvSequence;
using core::QuantizeInt8Row;

constexpr double kOutputBound = 1e-2;   // ‖y − y_fp32‖ / ‖y_fp32‖ of one step.
constexpr double kWeightsBound = 5e-3;  // Max |p − p_fp32| of one step's weights.

std::unique_ptr<KvBlockPool> MakeInt8Pool(const AttentionConfig& config, int64_t budget_bytes) {
  auto pool = KvBlockPool::Create(config, {.block_tokens = kTestBlockTokens,
                                           .budget_bytes = budget_bytes,
                                           .max_sequence_tokens = 4096,
                                           .int8 = true});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// ---- QuantizeInt8Row -----------------------------------------------------------------------

TEST(QuantizeInt8RowTest, ScaleIsTheSmallestBf16AboveMaxOver127AndValuesWithinHalfAStep) {
  std::vector<float> row = UniformValues(64, 3);
  row[5] = -2.75f;  // The largest |value|.
  std::vector<int8_t> q(64);
  const uint16_t bits = QuantizeInt8Row(row.data(), 64, q.data());
  const float scale = Int8Scale(bits);
  EXPECT_GE(scale, 2.75f / 127.0f);
  EXPECT_LT(Int8Scale(static_cast<uint16_t>(bits - 1)), 2.75f / 127.0f);  // The next bf16 down.
  EXPECT_EQ(q[5], -127);
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_GE(q[i], -127);
    EXPECT_LE(std::fabs(q[i] * scale - row[i]), scale / 2 * (1 + 1e-6)) << i;
  }
}

TEST(QuantizeInt8RowTest, ZeroRowsAndNonFiniteRows) {
  std::vector<float> row(16, 0.0f);
  std::vector<int8_t> q(16, 7);
  EXPECT_EQ(QuantizeInt8Row(row.data(), 16, q.data()), 0);
  for (int8_t v : q) EXPECT_EQ(v, 0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
    row.assign(16, 1.0f);
    row[9] = bad;
    const float scale = Int8Scale(QuantizeInt8Row(row.data(), 16, q.data()));
    EXPECT_TRUE(std::isnan(scale)) << bad;
    for (int8_t v : q) EXPECT_TRUE(std::isnan(v * scale)) << bad;
  }
}

// ---- The pool --------------------------------------------------------------------------------

TEST(Int8KvBlockPoolTest, BlocksHoldRowsAndScalesAndTheBudgetHolds194PercentOfBf16) {
  AttentionConfig config{.d_model = 512, .num_heads = 8, .compute_type = ComputeType::kBFloat16};
  constexpr int64_t kBudget = int64_t{1} << 30;
  auto bf16 = KvBlockPool::Create(config, {.block_tokens = 16, .budget_bytes = kBudget});
  auto int8 =
      KvBlockPool::Create(config, {.block_tokens = 16, .budget_bytes = kBudget, .int8 = true});
  ASSERT_TRUE(bf16.ok() && int8.ok());
  EXPECT_EQ((*int8)->element_type(), KvElementType::kInt8);
  // K and V: 16 tokens × 512 int8, and a 2-byte scale per token and head.
  EXPECT_EQ((*int8)->block_bytes(), 2 * 16 * 512 + 2 * 16 * 8 * 2);
  const int64_t sessions_bf16 = (*bf16)->total_blocks() / (2048 / 16);
  const int64_t sessions_int8 = (*int8)->total_blocks() / (2048 / 16);
  std::printf("sessions of 2048 tokens in 1 GiB: bf16 %lld, int8 %lld (%.3fx)\n",
              static_cast<long long>(sessions_bf16), static_cast<long long>(sessions_int8),
              static_cast<double>(sessions_int8) / sessions_bf16);
  EXPECT_GE(sessions_int8, 1.9 * sessions_bf16);
  // The rows stay a whole number of pages, so freed blocks can still be given back.
  KvSequence seq;
  ASSERT_TRUE((*int8)->Reserve(seq, 64).ok());
  std::vector<float> kv = UniformValues(64 * 512, 4);
  (*int8)->Write(seq, 64, kv.data(), 512, kv.data(), 512);
  (*int8)->Commit(seq, 64);
  (*int8)->Release(seq);
  EXPECT_EQ((*int8)->DiscardFreeBlocks(4), 4);
}

TEST(Int8KvBlockPoolTest, WriteQuantisesEachTokensHeadRowWithItsOwnScale) {
  AttentionConfig config{.d_model = 16, .num_heads = 2};
  auto pool =
      KvBlockPool::Create(config, {.block_tokens = 4, .budget_bytes = 1 << 16, .int8 = true});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvSequence seq;
  ASSERT_TRUE((*pool)->Reserve(seq, 6).ok());  // Crosses a block.
  const std::vector<float> k = UniformValues(6 * 16, 1), v = UniformValues(6 * 16, 2);
  (*pool)->Write(seq, 6, k.data(), 16, v.data(), 16);
  (*pool)->Commit(seq, 6);
  for (int64_t t = 0; t < 6; ++t) {
    const int32_t block = seq.blocks[t / 4];
    for (int64_t head = 0; head < 2; ++head) {
      for (const bool keys : {true, false}) {
        const std::vector<float>& src = keys ? k : v;
        const int8_t* rows =
            keys ? (*pool)->keys_int8(block, head) : (*pool)->values_int8(block, head);
        const float scale = Int8Scale(
            (keys ? (*pool)->key_scales(block, head) : (*pool)->value_scales(block, head))[t % 4]);
        float max_abs = 0;
        for (int64_t c = 0; c < 8; ++c)
          max_abs = std::max(max_abs, std::fabs(src[t * 16 + head * 8 + c]));
        EXPECT_GE(scale, max_abs / 127) << t << "," << head;
        EXPECT_LE(scale, max_abs / 127 * (1 + 0x1p-7)) << t << "," << head;
        for (int64_t c = 0; c < 8; ++c) {
          const int64_t at =
              keys ? core::Int8KeyOffset(4, 8, t % 4, c) : core::Int8ValueOffset(4, 8, t % 4, c);
          EXPECT_LE(std::fabs(rows[at] * scale - src[t * 16 + head * 8 + c]),
                    scale / 2 * (1 + 1e-6))
              << t << "," << head << "," << c;
        }
      }
    }
  }
}

// The block layout puts every element of every row at its own byte of the block's
// block_rows · dim (tiles of 16 keys and groups of 4 values, a last partial one included; an odd
// last column), keys in 32-byte runs of one column pair of a full tile's sixteen rows and values
// in 64-byte runs of sixteen columns of a group's four rows, and a row stored reads back.
TEST(Int8BlockLayoutTest, EveryElementHasItsOwnByteAndRowsReadBack) {
  for (const int64_t block_rows : {int64_t{1}, int64_t{4}, int64_t{16}, int64_t{20}, int64_t{32}}) {
    for (const int64_t dim : {int64_t{3}, int64_t{8}, int64_t{64}}) {
      SCOPED_TRACE(::testing::Message() << block_rows << " rows of " << dim);
      std::vector<int> key_uses(block_rows * dim), value_uses(block_rows * dim);
      for (int64_t r = 0; r < block_rows; ++r) {
        for (int64_t i = 0; i < dim; ++i) {
          ++key_uses.at(core::Int8KeyOffset(block_rows, dim, r, i));
          ++value_uses.at(core::Int8ValueOffset(block_rows, dim, r, i));
        }
      }
      for (int64_t b = 0; b < block_rows * dim; ++b) {
        EXPECT_EQ(key_uses[b], 1) << b;
        EXPECT_EQ(value_uses[b], 1) << b;
      }
      std::vector<int8_t> keys(block_rows * dim), values(block_rows * dim), row(dim), back(dim);
      for (int64_t r = 0; r < block_rows; ++r) {
        for (int64_t i = 0; i < dim; ++i) row[i] = static_cast<int8_t>(r * 7 + i - 60);
        core::StoreInt8KeyRow(row.data(), block_rows, dim, r, keys.data());
        core::StoreInt8ValueRow(row.data(), block_rows, dim, r, values.data());
      }
      for (int64_t r = 0; r < block_rows; ++r) {
        for (int64_t i = 0; i < dim; ++i) {
          row[i] = static_cast<int8_t>(r * 7 + i - 60);
          EXPECT_EQ(keys[core::Int8KeyOffset(block_rows, dim, r, i)], row[i]) << r << "," << i;
          EXPECT_EQ(values[core::Int8ValueOffset(block_rows, dim, r, i)], row[i]) << r << "," << i;
        }
        core::LoadInt8KeyRow(keys.data(), block_rows, dim, r, back.data());
        EXPECT_EQ(back, row) << "key row " << r;
        core::LoadInt8ValueRow(values.data(), block_rows, dim, r, back.data());
        EXPECT_EQ(back, row) << "value row " << r;
      }
    }
  }
  // What the integer kernel reads in one load.
  EXPECT_EQ(core::Int8KeyOffset(32, 64, 16 + 5, 2 * 7 + 1), 16 * 64 + 32 * 7 + 2 * 5 + 1);
  EXPECT_EQ(core::Int8ValueOffset(32, 64, 8 + 2, 16 + 3), 8 * 64 + 4 * (16 + 3) + 2);
}

// ---- Decoding over an int8 cache against an fp32 cache --------------------------------------

struct DecodeRun {
  std::vector<float> out;      // [steps, d]
  std::vector<float> weights;  // Per step: [heads, 1, keys].
  std::vector<int64_t> weight_offsets{0};
};

// A 16-row prompt, then `steps` one-row steps with weights, over `pool`.
DecodeRun Decode(const core::AttentionLayer& layer, KvBlockPool& pool, const std::vector<float>& x,
                 int64_t prompt, int64_t steps) {
  const int64_t d = layer.config().d_model, h = layer.config().num_heads;
  CachedAttentionExecutor executor;
  KvSequence seq;
  std::vector<float> scratch(prompt * d);
  EXPECT_TRUE(Step(executor, layer, pool, seq, x, 0, prompt, std::span<float>(scratch)).ok());
  DecodeRun run;
  run.out.resize(steps * d);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t keys = prompt + s + 1;
    const std::vector<int64_t> offsets{0, 1};
    KvSequence* caches[] = {&seq};
    const CachedAttentionInputs in{.query = {std::span(x).subspan((prompt + s) * d, d), offsets},
                                   .caches = caches,
                                   .mask = {.causal = true}};
    const size_t at = run.weights.size();
    run.weights.resize(at + h * keys);
    const absl::Status status =
        executor.Forward(layer, pool, in,
                         {.output = std::span(run.out).subspan(s * d, d),
                          .weights = std::span(run.weights).subspan(at, h * keys)});
    EXPECT_TRUE(status.ok()) << status;
    run.weight_offsets.push_back(static_cast<int64_t>(run.weights.size()));
  }
  pool.Release(seq);
  return run;
}

struct DecodeCase {
  int64_t d_model;
  int64_t heads;
};

class Int8DecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(Int8DecodeTest, FiveHundredTwelveStepsStayWithinBoundsOfAnFp32Cache) {
  const DecodeCase c = GetParam();
  const AttentionConfig config{.d_model = c.d_model, .num_heads = c.heads, .bias = true};
  const TestLayer layer = MakeTestLayer(config, 21);
  ASSERT_NE(layer.layer, nullptr);
  constexpr int64_t kPrompt = 16, kSteps = 512;
  const std::vector<float> x = UniformValues((kPrompt + kSteps) * c.d_model, 22);
  const int64_t budget = int64_t{8} << 20;
  const DecodeRun fp32 = Decode(*layer.layer, *MakeTestPool(config, budget), x, kPrompt, kSteps);
  const DecodeRun int8 = Decode(*layer.layer, *MakeInt8Pool(config, budget), x, kPrompt, kSteps);
  double worst_out = 0, worst_weights = 0, out_at[4] = {};
  for (int64_t s = 0; s < kSteps; ++s) {
    const auto step = [&](const DecodeRun& r) {
      return std::span(r.out).subspan(s * c.d_model, c.d_model);
    };
    const double rel = RelativeError(step(int8), step(fp32));
    worst_out = std::max(worst_out, rel);
    if (s % 128 == 127) out_at[s / 128] = rel;
    const int64_t begin = fp32.weight_offsets[s], end = fp32.weight_offsets[s + 1];
    const double w = MaxAbsDiff(std::span(int8.weights).subspan(begin, end - begin),
                                std::span(fp32.weights).subspan(begin, end - begin));
    worst_weights = std::max(worst_weights, w);
    EXPECT_LE(rel, kOutputBound) << "step " << s;
    EXPECT_LE(w, kWeightsBound) << "step " << s;
  }
  std::printf(
      "d_model %lld, %lld heads, %lld steps: output relative error max %.2e (steps "
      "128/256/384/512: "
      "%.2e %.2e %.2e %.2e), weights max abs error %.2e\n",
      static_cast<long long>(c.d_model), static_cast<long long>(c.heads),
      static_cast<long long>(kSteps), worst_out, out_at[0], out_at[1], out_at[2], out_at[3],
      worst_weights);
}

INSTANTIATE_TEST_SUITE_P(Widths, Int8DecodeTest,
                         ::testing::Values(DecodeCase{256, 4}, DecodeCase{64, 4}),
                         [](const ::testing::TestParamInfo<DecodeCase>& param_info) {
                           return "HeadDim" +
                                  std::to_string(param_info.param.d_model / param_info.param.heads);
                         });

// Prefill in chunks over a quantised past, and cross-attention memory in an int8 cache: each
// within kOutputBound of the full forward, sequence-wide.
TEST(Int8CachedAttentionTest, ChunkedPrefillAndCrossAttentionWithinBounds) {
  const AttentionConfig config{.d_model = 128, .num_heads = 2, .bias = true};
  const TestLayer layer = MakeTestLayer(config, 7);
  ASSERT_NE(layer.layer, nullptr);
  const std::vector<float> x = UniformValues(130 * config.d_model, 8);
  const std::vector<float> full = FullForward(*layer.layer, x, /*causal=*/true);
  for (const int64_t chunk : {int64_t{1}, int64_t{17}, int64_t{100}}) {
    const std::vector<float> got =
        Incremental(*layer.layer, *MakeInt8Pool(config, 4 << 20), x, chunk, chunk);
    EXPECT_LE(RelativeError(got, full), kOutputBound) << "chunk " << chunk;
  }
  const std::vector<float> memory = UniformValues(37 * config.d_model, 9);
  const std::vector<float> q = UniformValues(9 * config.d_model, 10);
  const std::vector<float> full_cross = FullForward(*layer.layer, q, false, memory);
  const std::vector<float> cross =
      CrossAttentionSteps(*layer.layer, *MakeInt8Pool(config, 4 << 20), memory, q);
  EXPECT_LE(RelativeError(cross, full_cross), kOutputBound);
}

// A bf16-compute model over an int8 cache: within the bf16 bound of its own full forward.
TEST(Int8CachedAttentionTest, Bf16ComputeOverAnInt8CacheWithinBf16Bounds) {
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  const AttentionConfig config{
      .d_model = 128, .num_heads = 2, .bias = true, .compute_type = ComputeType::kBFloat16};
  const TestLayer layer = MakeTestLayer(config, 12);
  ASSERT_NE(layer.layer, nullptr);
  const std::vector<float> x = UniformValues(70 * config.d_model, 13);
  const std::vector<float> full = FullForward(*layer.layer, x, /*causal=*/true);
  const std::vector<float> got =
      Incremental(*layer.layer, *MakeInt8Pool(config, 4 << 20), x, 16, 1);
  const std::vector<double> full_double(full.begin(), full.end());
  const ErrorSummary error = SummariseError(got, full_double);
  EXPECT_LE(error.max_abs_error, kBf16OutputBound * error.rms) << "RMS " << error.rms;
}

}  // namespace
}  // namespace attnserve::testing
