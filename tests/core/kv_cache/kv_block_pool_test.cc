// KvBlockPool: block accounting (exhaustion, release, all-or-nothing Reserve, no leak under
// random use, reuse of scattered blocks) and the model-version identity.
#include "core/kv_cache/kv_block_pool.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/core/kv_cache/kv_pool_test_support.h"

namespace attnserve::core {
namespace {

constexpr AttentionConfig kConfig{.d_model = 16, .num_heads = 2};
constexpr int64_t kBlockTokens = 4;
// One block: 2 (K, V) × 4 tokens × 16 floats × 4 bytes = 512 bytes.
constexpr int64_t kBlockBytes = 2 * kBlockTokens * 16 * 4;

std::unique_ptr<KvBlockPool> MakePool(int64_t blocks, int64_t max_tokens = 1 << 20) {
  auto pool = KvBlockPool::Create(kConfig, {.block_tokens = kBlockTokens,
                                            .budget_bytes = blocks * kBlockBytes,
                                            .max_sequence_tokens = max_tokens});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

using ::attnserve::testing::AppendTokens;

TEST(KvBlockPoolTest, BudgetSetsTheNumberOfBlocks) {
  auto pool = MakePool(10);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->total_blocks(), 10);
  EXPECT_EQ(pool->free_blocks(), 10);
  EXPECT_EQ(pool->block_elements(), 2 * kBlockTokens * 16);
  EXPECT_EQ(pool->block_bytes(), kBlockBytes);
  EXPECT_EQ(pool->element_type(), KvElementType::kFloat32);
}

TEST(KvBlockPoolTest, InvalidOptionsAreRefused) {
  EXPECT_EQ(KvBlockPool::Create(kConfig, {.block_tokens = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockPool::Create(kConfig, {.block_tokens = 4, .budget_bytes = kBlockBytes - 1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockPool::Create(kConfig, {.max_sequence_tokens = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockPool::Create({.d_model = 10, .num_heads = 3}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvBlockPoolTest, ExhaustionLeavesTheSequenceUnchangedAndReleaseFreesEverything) {
  auto pool = MakePool(3);
  ASSERT_NE(pool, nullptr);
  KvSequence a, b;
  ASSERT_TRUE(AppendTokens(*pool, a, 5).ok());  // 2 blocks.
  ASSERT_TRUE(AppendTokens(*pool, b, 4).ok());  // 1 block.
  EXPECT_EQ(pool->free_blocks(), 0);
  ASSERT_TRUE(AppendTokens(*pool, a, 3).ok());  // Fills a's second block: no new block needed.
  const KvSequence before = a;
  const absl::Status full = AppendTokens(*pool, a, 1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(a.blocks, before.blocks);
  EXPECT_EQ(a.length, before.length);
  EXPECT_EQ(pool->free_blocks(), 0);

  pool->Release(b);
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(b.length, 0);
  EXPECT_EQ(pool->free_blocks(), 1);
  EXPECT_TRUE(AppendTokens(*pool, a, 1).ok());
  pool->Release(a);
  EXPECT_EQ(pool->free_blocks(), 3);
}

TEST(KvBlockPoolTest, ReserveIsAllOrNothingForMultiBlockGrowth) {
  auto pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  KvSequence a;
  ASSERT_TRUE(AppendTokens(*pool, a, 2).ok());
  // 2 + 15 tokens need 5 blocks; 4 exist: nothing may be taken.
  EXPECT_EQ(pool->Reserve(a, 15).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.blocks.size(), 1u);
  EXPECT_EQ(a.length, 2);
  EXPECT_EQ(pool->free_blocks(), 3);
}

TEST(KvBlockPoolTest, TrimUndoesAnUncommittedReserve) {
  auto pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  KvSequence a;
  ASSERT_TRUE(AppendTokens(*pool, a, 3).ok());
  ASSERT_TRUE(pool->Reserve(a, 9).ok());
  EXPECT_EQ(a.blocks.size(), 3u);
  pool->Trim(a);
  EXPECT_EQ(a.blocks.size(), 1u);
  EXPECT_EQ(a.length, 3);
  EXPECT_EQ(pool->free_blocks(), 3);
}

TEST(KvBlockPoolTest, MaximumLengthIsRefusedWithoutChange) {
  auto pool = MakePool(8, /*max_tokens=*/10);
  ASSERT_NE(pool, nullptr);
  KvSequence a;
  ASSERT_TRUE(AppendTokens(*pool, a, 10).ok());
  const absl::Status s = pool->Reserve(a, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(a.length, 10);
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(pool->free_blocks(), 5);
}

TEST(KvBlockPoolTest, ScatteredFreeBlocksServeOneLongSequence) {
  constexpr int64_t kBlocks = 16;
  auto pool = MakePool(kBlocks);
  ASSERT_NE(pool, nullptr);
  std::vector<KvSequence> seqs(kBlocks);
  for (KvSequence& s : seqs) ASSERT_TRUE(AppendTokens(*pool, s, kBlockTokens).ok());
  ASSERT_EQ(pool->free_blocks(), 0);
  // Free every other sequence: the free blocks are scattered through the arena.
  std::set<int32_t> freed;
  for (int64_t i = 0; i < kBlocks; i += 2) {
    freed.insert(seqs[i].blocks[0]);
    pool->Release(seqs[i]);
  }
  KvSequence long_one;
  ASSERT_TRUE(AppendTokens(*pool, long_one, kBlockTokens * kBlocks / 2).ok());
  EXPECT_EQ(std::set<int32_t>(long_one.blocks.begin(), long_one.blocks.end()), freed);
  EXPECT_EQ(pool->free_blocks(), 0);
}

TEST(KvBlockPoolTest, NoBlockLeaksAfterManyRandomOperations) {
  constexpr int64_t kBlocks = 64;
  auto pool = MakePool(kBlocks, /*max_tokens=*/100);
  ASSERT_NE(pool, nullptr);
  std::vector<KvSequence> seqs(12);
  std::mt19937_64 rng(7);
  int64_t exhausted = 0, too_long = 0;
  for (int op = 0; op < 100000; ++op) {
    KvSequence& s = seqs[rng() % seqs.size()];
    if (rng() % 4 == 0) {
      pool->Release(s);
    } else {
      const KvSequence before = s;
      const absl::Status st = AppendTokens(*pool, s, static_cast<int64_t>(rng() % 9));
      if (!st.ok()) {
        exhausted += st.code() == absl::StatusCode::kResourceExhausted;
        too_long += st.code() == absl::StatusCode::kOutOfRange;
        ASSERT_EQ(s.blocks, before.blocks);
        ASSERT_EQ(s.length, before.length);
      }
    }
    if (op % 1000 == 0) {
      // Every block is either free or owned by exactly one sequence, and tables are tight.
      std::set<int32_t> owned;
      size_t count = 0;
      for (const KvSequence& q : seqs) {
        ASSERT_EQ(static_cast<int64_t>(q.blocks.size()),
                  (q.length + kBlockTokens - 1) / kBlockTokens);
        owned.insert(q.blocks.begin(), q.blocks.end());
        count += q.blocks.size();
      }
      ASSERT_EQ(owned.size(), count);
      ASSERT_EQ(static_cast<int64_t>(count) + pool->free_blocks(), kBlocks);
    }
  }
  EXPECT_GT(exhausted, 0);  // The sequence mix does hit a full pool and the length limit.
  EXPECT_GT(too_long, 0);
  for (KvSequence& s : seqs) pool->Release(s);
  EXPECT_EQ(pool->free_blocks(), kBlocks);
}

TEST(KvBlockPoolTest, IdentityMismatchIsRefused) {
  auto pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  EXPECT_TRUE(pool->CheckIdentity(kConfig).ok());
  EXPECT_TRUE(pool->CheckIdentity({.d_model = 16, .num_heads = 2, .bias = true}).ok());
  EXPECT_EQ(pool->CheckIdentity({.d_model = 32, .num_heads = 2}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->CheckIdentity({.d_model = 16, .num_heads = 4}).code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::Status variant = pool->CheckIdentity(
      {.d_model = 16, .num_heads = 1, .variant = AttentionVariant::kSingleHead});
  EXPECT_EQ(variant.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KvBlockPoolTest, WriteStoresEachHeadContiguously) {
  auto pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  KvSequence a;
  ASSERT_TRUE(pool->Reserve(a, 5).ok());
  std::vector<float> k(5 * 16), v(5 * 16);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i);
    v[i] = -static_cast<float>(i);
  }
  pool->Write(a, 5, k.data(), 16, v.data(), 16);
  pool->Commit(a, 5);
  for (int64_t t = 0; t < 5; ++t) {
    for (int64_t head = 0; head < 2; ++head) {
      const int32_t block = a.blocks[t / kBlockTokens];
      const int64_t slot = (t % kBlockTokens) * 8;
      for (int64_t c = 0; c < 8; ++c) {
        EXPECT_EQ(pool->keys(block, head)[slot + c], k[t * 16 + head * 8 + c]);
        EXPECT_EQ(pool->values(block, head)[slot + c], v[t * 16 + head * 8 + c]);
      }
    }
  }
}

}  // namespace
}  // namespace attnserve::core
