// CachedAttentionExecutor's refusals: a full pool, a too-long sequence, another model's layer and
// inconsistent inputs each return their status and leave every cache exactly as before.
#include <cstdint>
#include <vector>

#include "core/kv_cache/cached_attention.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"
#include "tests/core/kv_cache/kv_test_support.h"

namespace attnserve::testing {
namespace {

using core::AttentionConfig;
using core::CachedAttentionExecutor;
using core::CachedAttentionInputs;
using core::KvBlockPool;
using core::KvSequence;

constexpr AttentionConfig kConfig{.d_model = 16, .num_heads = 2, .bias = true};
constexpr int64_t kBlock = 4;
constexpr int64_t kBlockBytes = 2 * kBlock * 16 * 4;

struct Fixture {
  TestLayer layer = MakeTestLayer(kConfig, 1);
  std::unique_ptr<KvBlockPool> pool;
  CachedAttentionExecutor executor;

  explicit Fixture(int64_t blocks, int64_t max_tokens = 1000) {
    auto p = KvBlockPool::Create(kConfig, {.block_tokens = kBlock,
                                           .budget_bytes = blocks * kBlockBytes,
                                           .max_sequence_tokens = max_tokens});
    EXPECT_TRUE(p.ok()) << p.status();
    pool = std::move(*p);
  }

  // One forward of `rows` new rows per sequence.
  absl::Status Run(const std::vector<KvSequence*>& caches, const std::vector<int64_t>& rows,
                   uint64_t seed, std::vector<float>* output = nullptr) {
    std::vector<int64_t> offsets{0};
    for (int64_t r : rows) offsets.push_back(offsets.back() + r);
    const std::vector<float> x = UniformValues(offsets.back() * 16, seed);
    std::vector<float> out(x.size());
    const CachedAttentionInputs in{
        .query = {x, offsets}, .caches = caches, .mask = {.causal = true}};
    const absl::Status s = executor.Forward(*layer.layer, *pool, in, {.output = out});
    if (output != nullptr) *output = out;
    return s;
  }
};

// The cached K/V values of `seq` (what a later step reads).
std::vector<float> CachedValues(const KvBlockPool& pool, const KvSequence& seq) {
  std::vector<float> values;
  for (int64_t t = 0; t < seq.length; ++t) {
    for (int64_t head = 0; head < 2; ++head) {
      const int32_t b = seq.blocks[t / kBlock];
      const float* k = pool.keys(b, head) + (t % kBlock) * 8;
      const float* v = pool.values(b, head) + (t % kBlock) * 8;
      values.insert(values.end(), k, k + 8);
      values.insert(values.end(), v, v + 8);
    }
  }
  return values;
}

TEST(CachedAttentionErrorsTest, FullPoolLeavesEveryCacheUnchanged) {
  Fixture f(/*blocks=*/5);
  KvSequence a, b;
  ASSERT_TRUE(f.Run({&a, &b}, {6, 5}, 1).ok());  // 2 + 2 blocks; 1 free.
  const KvSequence a0 = a, b0 = b;
  const std::vector<float> a_values = CachedValues(*f.pool, a), b_values = CachedValues(*f.pool, b);
  // a needs 1 more block (free), b needs 2: the whole step is refused, a's block given back.
  const absl::Status s = f.Run({&a, &b}, {3, 7}, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(a.blocks, a0.blocks);
  EXPECT_EQ(a.length, a0.length);
  EXPECT_EQ(b.blocks, b0.blocks);
  EXPECT_EQ(b.length, b0.length);
  EXPECT_EQ(CachedValues(*f.pool, a), a_values);
  EXPECT_EQ(CachedValues(*f.pool, b), b_values);
  EXPECT_EQ(f.pool->free_blocks(), 1);
  // The caches still work: a decode step of each sequence fits.
  EXPECT_TRUE(f.Run({&a, &b}, {1, 1}, 3).ok());
  EXPECT_EQ(a.length, 7);
  EXPECT_EQ(b.length, 6);
}

TEST(CachedAttentionErrorsTest, StepAfterRefusalEqualsStepWithoutIt) {
  Fixture f(/*blocks=*/3), g(/*blocks=*/3);
  KvSequence a, b;
  ASSERT_TRUE(f.Run({&a}, {7}, 1).ok());
  ASSERT_TRUE(g.Run({&b}, {7}, 1).ok());
  EXPECT_EQ(f.Run({&a}, {9}, 2).code(), absl::StatusCode::kResourceExhausted);
  std::vector<float> out_a, out_b;
  ASSERT_TRUE(f.Run({&a}, {1}, 4, &out_a).ok());
  ASSERT_TRUE(g.Run({&b}, {1}, 4, &out_b).ok());
  EXPECT_EQ(out_a, out_b);
}

TEST(CachedAttentionErrorsTest, MaximumLengthIsRefused) {
  Fixture f(/*blocks=*/10, /*max_tokens=*/8);
  KvSequence a;
  ASSERT_TRUE(f.Run({&a}, {8}, 1).ok());
  const absl::Status s = f.Run({&a}, {1}, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("max_sequence_tokens"), std::string_view::npos) << s;
  EXPECT_EQ(a.length, 8);
}

TEST(CachedAttentionErrorsTest, AnotherModelsLayerIsRefused) {
  Fixture f(/*blocks=*/4);
  const TestLayer other = MakeTestLayer({.d_model = 16, .num_heads = 4}, 2);
  ASSERT_NE(other.layer, nullptr);
  KvSequence a;
  KvSequence* caches[] = {&a};
  const std::vector<int64_t> offsets{0, 2};
  const std::vector<float> x = UniformValues(32, 3);
  std::vector<float> out(32);
  const CachedAttentionInputs in{.query = {x, offsets}, .caches = caches};
  const absl::Status s = f.executor.Forward(*other.layer, *f.pool, in, {.output = out});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("num_heads"), std::string_view::npos) << s;
  EXPECT_EQ(a.length, 0);
  EXPECT_EQ(f.pool->free_blocks(), 4);
  const std::vector<int64_t> mem_offsets{0, 2};
  EXPECT_EQ(f.executor.LoadMemory(*other.layer, *f.pool, {x, mem_offsets}, caches).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CachedAttentionErrorsTest, InconsistentInputsAreRefusedByField) {
  Fixture f(/*blocks=*/4);
  KvSequence a;
  const std::vector<int64_t> offsets{0, 2};
  const std::vector<float> x = UniformValues(32, 3);
  std::vector<float> out(32);
  auto forward = [&](const CachedAttentionInputs& in) {
    return f.executor.Forward(*f.layer.layer, *f.pool, in, {.output = out});
  };
  KvSequence* one[] = {&a};
  KvSequence* two[] = {&a, &a};
  const std::vector<int64_t> two_offsets{0, 1, 2};
  struct Bad {
    CachedAttentionInputs in;
    const char* field;
  };
  const std::vector<uint8_t> short_mask(3, 1);
  const Bad cases[] = {
      {{.query = {x, offsets}, .caches = {}}, "caches"},
      {{.query = {x, two_offsets}, .caches = two}, "caches"},
      {{.query = {x, offsets}, .caches = one, .cross_attention = true}, "caches[0]"},
      {{.query = {x, offsets}, .caches = one, .mask = {.explicit_mask = short_mask}},
       "mask.explicit_mask"},
  };
  for (const Bad& c : cases) {
    const absl::Status s = forward(c.in);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.field), std::string_view::npos) << s;
  }
  EXPECT_EQ(a.length, 0);
  EXPECT_EQ(f.pool->free_blocks(), 4);
}

// Alternating ±3e38 rows overflow the projections: every score of a query is NaN. That is not a
// fully masked row (whose output is zeros, and finite): the step fails OutOfRange, as an uncached
// forward does, and the cache is as before — for a decode step (AttendRow) and a chunk of several
// rows (AttendRows' GEMM path).
TEST(CachedAttentionErrorsTest, ScoresThatAreAllNaNFailOutOfRange) {
  for (const int64_t rows : {1, 3}) {
    Fixture f(/*blocks=*/4);
    KvSequence a;
    ASSERT_TRUE(f.Run({&a}, {3}, 1).ok());
    KvSequence* caches[] = {&a};
    std::vector<float> x(16 * rows);
    for (size_t i = 0; i < x.size(); ++i) x[i] = i % 2 == 0 ? 3e38f : -3e38f;
    const std::vector<int64_t> offsets{0, rows};
    std::vector<float> out(16 * rows);
    const CachedAttentionInputs in{
        .query = {x, offsets}, .caches = caches, .mask = {.causal = true}};
    const absl::Status s = f.executor.Forward(*f.layer.layer, *f.pool, in, {.output = out});
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << rows << " rows: " << s;
    EXPECT_EQ(a.length, 3) << rows << " rows";
  }
}

}  // namespace
}  // namespace attnserve::testing
