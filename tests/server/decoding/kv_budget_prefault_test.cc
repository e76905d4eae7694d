// KvBudget's prefault: what the idle decoding loop maps ahead of need — up to
// prefault_ahead_bytes above each pool's peak, in slices the caller bounds, never past the budget
// — and touched_bytes(), the cache's share of the resident set. Then the runtime: its idle loop
// does it, and Stats() reports it.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "gmock/gmock.h"
#include "server/batching/fake_clock.h"
#include "server/decoding/kv_budget.h"
#include "tests/server/decoding/decode_test_support.h"

namespace attnserve::testing::kv_budget_prefault_test {
namespace {

using decoding::KvBudget;
using decoding::KvBudgetOptions;

// One block of the test models: 2 (K, V) × 16 tokens × kD (32) floats × 4 bytes.
constexpr int64_t kBlockBytes = 2 * 16 * kD * 4;

// Calls Prefault(slice_bytes) until nothing is pending; returns the calls, each expected to touch
// `slice_bytes` except the last.
int PrefaultAll(KvBudget& budget, int64_t slice_bytes, int64_t* total) {
  int calls = 0;
  *total = 0;
  while (budget.PrefaultPending() && calls < 10000) {
    const int64_t touched = budget.Prefault(slice_bytes);
    EXPECT_GT(touched, 0);
    EXPECT_LE(touched, std::max(slice_bytes, kBlockBytes));
    *total += touched;
    ++calls;
  }
  EXPECT_EQ(budget.Prefault(slice_bytes), 0) << "Prefault did work PrefaultPending denied";
  return calls;
}

// Grows `cache` by `tokens` as the runtime does: Admit, Reserve, Commit, Refresh.
void Grow(KvBudget& budget, core::KvBlockPool& pool, core::KvSequence& cache, int64_t tokens) {
  int64_t pending = 0;
  ASSERT_TRUE(budget.Admit(pool, cache, tokens, &pending).ok());
  ASSERT_TRUE(pool.Reserve(cache, tokens).ok());
  pool.Commit(cache, cache.length + tokens);
  budget.Refresh();
}

TEST(KvBudgetPrefaultTest, MapsAheadOfThePeakInSlicesAndFollowsItsGrowth) {
  const TestModel m = MakeModel("m", 1, 1);
  KvBudget budget(
      {.budget_bytes = 256 * kBlockBytes, .prefault_ahead_bytes = 16 * kBlockBytes + 100});
  absl::StatusOr<core::KvBlockPool*> pool = budget.Attach(*m.model);
  ASSERT_TRUE(pool.ok()) << pool.status();
  int64_t total = 0;
  EXPECT_EQ(PrefaultAll(budget, 2 * kBlockBytes, &total), 8);
  EXPECT_EQ(total, 16 * kBlockBytes);  // Whole blocks: the 100 bytes are rounded down.
  EXPECT_EQ(budget.touched_bytes(), 16 * kBlockBytes);
  EXPECT_EQ(budget.used_bytes(), 0);

  // Growing within what is mapped: the peak rises to 3 blocks, so 3 more are due.
  core::KvSequence cache;
  Grow(budget, **pool, cache, 40);
  EXPECT_EQ(budget.used_bytes(), 3 * kBlockBytes);
  EXPECT_EQ(budget.touched_bytes(), 16 * kBlockBytes);
  EXPECT_EQ(PrefaultAll(budget, 1 << 20, &total), 1);
  EXPECT_EQ(total, 3 * kBlockBytes);
  EXPECT_EQ(budget.touched_bytes(), 19 * kBlockBytes);

  // A slice smaller than a block still maps one.
  Grow(budget, **pool, cache, 16);
  EXPECT_EQ(budget.Prefault(1), kBlockBytes);

  // The pool goes with its last session, and its pages with it.
  budget.Detach(*m.model, cache);
  EXPECT_EQ(budget.touched_bytes(), 0);
  EXPECT_FALSE(budget.PrefaultPending());
}

TEST(KvBudgetPrefaultTest, AStoppedSliceTouchesNothingAndLeavesTheWorkPending) {
  const TestModel m = MakeModel("m", 1, 1);
  KvBudget budget({.budget_bytes = 256 * kBlockBytes, .prefault_ahead_bytes = 16 * kBlockBytes});
  ASSERT_TRUE(budget.Attach(*m.model).ok());
  std::atomic<bool> stop{true};
  EXPECT_EQ(budget.Prefault(4 * kBlockBytes, &stop), 0);
  EXPECT_EQ(budget.touched_bytes(), 0);
  EXPECT_TRUE(budget.PrefaultPending());
  stop = false;
  EXPECT_EQ(budget.Prefault(4 * kBlockBytes, &stop), 4 * kBlockBytes);
  EXPECT_EQ(budget.touched_bytes(), 4 * kBlockBytes);
}

TEST(KvBudgetPrefaultTest, TouchedPagesOfAllPoolsStayWithinTheBudget) {
  const TestModel v1 = MakeModel("m", 1, 1);
  const TestModel v2 = MakeModel("m", 2, 2);
  KvBudget budget({.budget_bytes = 10 * kBlockBytes, .prefault_ahead_bytes = 1 << 20});
  absl::StatusOr<core::KvBlockPool*> pool1 = budget.Attach(*v1.model);
  ASSERT_TRUE(pool1.ok()) << pool1.status();
  core::KvSequence cache1;
  Grow(budget, **pool1, cache1, 64);  // 4 blocks in use.
  int64_t total = 0;
  PrefaultAll(budget, 1 << 20, &total);
  EXPECT_EQ(total, 6 * kBlockBytes);
  EXPECT_EQ(budget.touched_bytes(), 10 * kBlockBytes);

  // A second version's pool gets nothing ahead: the first one's pages fill the budget.
  absl::StatusOr<core::KvBlockPool*> pool2 = budget.Attach(*v2.model);
  ASSERT_TRUE(pool2.ok()) << pool2.status();
  EXPECT_FALSE(budget.PrefaultPending());
  EXPECT_EQ(budget.Prefault(1 << 20), 0);
  // Once the first version's pool is gone, the second one's are due.
  budget.Detach(*v1.model, cache1);
  EXPECT_EQ(budget.touched_bytes(), 0);
  PrefaultAll(budget, 1 << 20, &total);
  EXPECT_EQ(total, 10 * kBlockBytes);
  EXPECT_EQ((*pool2)->touched_blocks(), 10);
}

// Two versions with sessions: the first one's freed blocks give their pages back as the second
// one grows, so the resident pages of both pools together stay one budget (not one each).
TEST(KvBudgetPrefaultTest, ResidentPagesOfTwoVersionsStayWithinOneBudget) {
  const TestModel v1 = MakeModel("m", 1, 1);
  const TestModel v2 = MakeModel("m", 2, 2);
  KvBudget budget({.budget_bytes = 8 * kBlockBytes, .prefault_ahead_bytes = 0});
  absl::StatusOr<core::KvBlockPool*> pool1 = budget.Attach(*v1.model);
  ASSERT_TRUE(pool1.ok()) << pool1.status();
  ASSERT_TRUE(budget.Attach(*v1.model).ok());  // A second session on v1.
  core::KvSequence kept, freed;
  Grow(budget, **pool1, kept, 16);       // 1 block.
  Grow(budget, **pool1, freed, 7 * 16);  // 7 blocks.
  budget.Detach(*v1.model, freed);       // Its session ends; the other keeps v1's pool.
  EXPECT_EQ(budget.used_bytes(), kBlockBytes);
  EXPECT_EQ(budget.touched_bytes(), 8 * kBlockBytes);  // Within the budget: nothing given back.

  absl::StatusOr<core::KvBlockPool*> pool2 = budget.Attach(*v2.model);
  ASSERT_TRUE(pool2.ok()) << pool2.status();
  core::KvSequence grown;
  Grow(budget, **pool2, grown, 7 * 16);
  EXPECT_EQ(budget.used_bytes(), 8 * kBlockBytes);
  EXPECT_EQ(budget.touched_bytes(), 8 * kBlockBytes);
  EXPECT_EQ((*pool1)->resident_blocks(), 1);
  EXPECT_EQ((*pool2)->resident_blocks(), 7);
  budget.Detach(*v2.model, grown);
  budget.Detach(*v1.model, kept);
  EXPECT_EQ(budget.touched_bytes(), 0);
}

TEST(KvBudgetPrefaultTest, NothingAheadWhenTurnedOff) {
  const TestModel m = MakeModel("m", 1, 1);
  KvBudget budget({.budget_bytes = 64 * kBlockBytes, .prefault_ahead_bytes = 0});
  absl::StatusOr<core::KvBlockPool*> pool = budget.Attach(*m.model);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_FALSE(budget.PrefaultPending());
  EXPECT_EQ(budget.Prefault(1 << 20), 0);
  core::KvSequence cache;
  Grow(budget, **pool, cache, 20);
  EXPECT_EQ(budget.touched_bytes(), 2 * kBlockBytes);  // Only what was handed out.
  EXPECT_FALSE(budget.PrefaultPending());
  budget.Detach(*m.model, cache);
}

TEST(KvBudgetPrefaultTest, TheIdleLoopMapsAheadAndStatsReportIt) {
  batching::FakeClock clock(1000);
  RecordingListener listener;
  auto runtime = decoding::DecodeRuntime::Create(
      {.kv = {.budget_bytes = 256 * kBlockBytes, .prefault_ahead_bytes = 8 * kBlockBytes},
       .idle_timeout_us = 0,
       .compute_threads = 1},
      &clock, &listener);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  decoding::DecodeRuntime& rt = **runtime;
  const TestModel m = MakeModel("m", 1, 3);
  const decoding::SessionId id = OpenReady(rt, m.model);
  // The loop goes to wait only once nothing is left to map.
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(batching::kNoDeadline, kWait));
  EXPECT_EQ(rt.Stats().kv_bytes_touched, 8 * kBlockBytes);
  EXPECT_EQ(rt.Stats().kv_bytes_used, 0);

  Answer answer;
  ASSERT_TRUE(Append(rt, id, UniformValues(20 * kD, 4), &answer).ok());  // 2 blocks.
  ASSERT_TRUE(answer.Get().ok()) << answer.Get().status();
  ASSERT_TRUE(clock.BlockUntilWaiterWithDeadline(batching::kNoDeadline, kWait));
  EXPECT_EQ(rt.Stats().kv_bytes_touched, 10 * kBlockBytes);
  EXPECT_EQ(rt.Stats().kv_bytes_used, 2 * kBlockBytes);
}

TEST(KvBudgetPrefaultTest, ANegativeAheadIsRefused) {
  const absl::Status s =
      decoding::ValidateDecodeRuntimeOptions({.kv = {.prefault_ahead_bytes = -1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("kv.prefault_ahead_bytes"));
}

}  // namespace
}  // namespace attnserve::testing::kv_budget_prefault_test
