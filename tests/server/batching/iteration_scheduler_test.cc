// IterationScheduler: decode steps of every key in every iteration, prompts cut into chunks under
// the token budget, round robin between prefilling keys, items of one key in order and at most
// one slice per key per iteration.
#include "server/batching/iteration_scheduler.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

namespace attnserve::batching {
namespace {

struct Work {
  int64_t n;
  int id;
  int64_t tokens() const { return n; }
};

using Scheduler = IterationScheduler<Work>;

void Add(Scheduler& scheduler, uint64_t key, int64_t tokens, int id) {
  scheduler.Add(key, std::make_unique<Work>(Work{tokens, id}));
}

TEST(IterationSchedulerOptionsTest, RejectsBadValuesNamingTheField) {
  EXPECT_TRUE(ValidateIterationSchedulerOptions({}).ok());
  const absl::Status zero = ValidateIterationSchedulerOptions({.max_iteration_tokens = 0});
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("max_iteration_tokens"), std::string::npos) << zero;
  const absl::Status big =
      ValidateIterationSchedulerOptions({.max_iteration_tokens = 100, .prefill_chunk_tokens = 101});
  EXPECT_NE(big.message().find("prefill_chunk_tokens: expected 1..max_iteration_tokens (100)"),
            std::string::npos)
      << big;
}

TEST(IterationSchedulerTest, LongPromptIsChunkedWhileDecodeStepsRunEveryIteration) {
  // Steps wait in every iteration, so chunks alternate with decode-only iterations: a step that
  // waited through a chunk is not delayed by another one.
  Scheduler scheduler({.max_iteration_tokens = 80, .prefill_chunk_tokens = 64});
  Add(scheduler, 7, 200, 0);  // A long prompt.
  int next_id = 1;
  int64_t prefilled = 0;
  int iterations = 0;
  while (!scheduler.empty() || iterations == 0) {
    // Three decoding sessions each have one step waiting in every iteration.
    for (uint64_t key : {1, 2, 3}) Add(scheduler, key, 1, next_id++);
    std::vector<Scheduler::Slice> slices = scheduler.NextIteration();
    ++iterations;
    std::set<uint64_t> decode_keys;
    int64_t tokens = 0;
    for (const auto& slice : slices) {
      tokens += slice.count;
      if (slice.key == 7) {
        EXPECT_EQ(slice.begin, prefilled);
        EXPECT_LE(slice.count, 64);
        prefilled += slice.count;
        EXPECT_EQ(slice.finished != nullptr, prefilled == 200);
      } else {
        EXPECT_TRUE(slice.decode());
        decode_keys.insert(slice.key);
      }
    }
    EXPECT_EQ(decode_keys, (std::set<uint64_t>{1, 2, 3})) << "iteration " << iterations;
    EXPECT_LE(tokens, 80);
    EXPECT_EQ(tokens > 3, iterations % 2 == 1) << "iteration " << iterations;
    if (prefilled == 200) break;
  }
  EXPECT_EQ(prefilled, 200);
  EXPECT_EQ(iterations, 7);  // 64, -, 64, -, 64, -, 8.
  EXPECT_TRUE(scheduler.empty());
}

TEST(IterationSchedulerTest, ChunksRunInEveryIterationWhileNoStepWaits) {
  // One client's pattern: its steps arrive only after their answers, i.e. between iterations.
  Scheduler scheduler({.max_iteration_tokens = 80, .prefill_chunk_tokens = 64});
  Add(scheduler, 7, 200, 0);
  std::vector<int64_t> prompt_tokens;
  std::vector<size_t> steps;
  for (int i = 0; i < 5 && !scheduler.empty(); ++i) {
    if (i == 1) Add(scheduler, 1, 1, 1);  // A step waits for the second iteration only.
    int64_t prompt = 0;
    size_t decode = 0;
    for (const auto& slice : scheduler.NextIteration()) {
      if (slice.key == 7) prompt += slice.count;
      decode += slice.decode();
    }
    prompt_tokens.push_back(prompt);
    steps.push_back(decode);
  }
  // The step after a chunk iteration runs alone; chunks go on as soon as no step waits.
  EXPECT_EQ(prompt_tokens, (std::vector<int64_t>{64, 0, 64, 64, 8}));
  EXPECT_EQ(steps, (std::vector<size_t>{0, 1, 0, 0, 0}));
}

TEST(IterationSchedulerTest, PrefillIsRoundRobinAndOneSlicePerKey) {
  Scheduler scheduler({.max_iteration_tokens = 20, .prefill_chunk_tokens = 10});
  for (uint64_t key : {1, 2, 3}) Add(scheduler, key, 100, static_cast<int>(key));
  std::map<uint64_t, int> chunks;
  for (int i = 0; i < 6; ++i) {
    std::set<uint64_t> keys;
    for (const auto& slice : scheduler.NextIteration()) {
      EXPECT_TRUE(keys.insert(slice.key).second) << "two slices of key " << slice.key;
      EXPECT_EQ(slice.count, 10);
      ++chunks[slice.key];
    }
    EXPECT_EQ(keys.size(), 2u);
  }
  // 12 chunks over 3 keys: each got exactly 4.
  EXPECT_EQ(chunks, (std::map<uint64_t, int>{{1, 4}, {2, 4}, {3, 4}}));
}

TEST(IterationSchedulerTest, ItemsOfOneKeyRunInOrderOnePerIteration) {
  Scheduler scheduler({.max_iteration_tokens = 100, .prefill_chunk_tokens = 4});
  Add(scheduler, 5, 6, 0);  // Prefill of 6: chunks 4 + 2.
  Add(scheduler, 5, 1, 1);
  Add(scheduler, 5, 1, 2);
  std::vector<int> finished;
  std::vector<int64_t> counts;
  while (!scheduler.empty()) {
    auto slices = scheduler.NextIteration();
    ASSERT_EQ(slices.size(), 1u);
    counts.push_back(slices[0].count);
    if (slices[0].finished) finished.push_back(slices[0].finished->id);
  }
  EXPECT_EQ(counts, (std::vector<int64_t>{4, 2, 1, 1}));
  EXPECT_EQ(finished, (std::vector<int>{0, 1, 2}));
}

TEST(IterationSchedulerTest, DecodeStepsOverTheBudgetRotate) {
  Scheduler scheduler({.max_iteration_tokens = 2, .prefill_chunk_tokens = 1});
  for (uint64_t key : {1, 2, 3}) Add(scheduler, key, 1, static_cast<int>(key));
  std::vector<uint64_t> first, second;
  for (const auto& s : scheduler.NextIteration()) first.push_back(s.key);
  for (uint64_t key : {1, 2}) Add(scheduler, key, 1, 10 + static_cast<int>(key));
  for (const auto& s : scheduler.NextIteration()) second.push_back(s.key);
  EXPECT_EQ(first, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(second, (std::vector<uint64_t>{3, 1}));  // Key 3 waited one iteration, not more.
}

TEST(IterationSchedulerTest, RemoveTakesBackPartlyRunAndQueuedItems) {
  Scheduler scheduler({.max_iteration_tokens = 8, .prefill_chunk_tokens = 8});
  Add(scheduler, 1, 20, 0);
  Add(scheduler, 1, 1, 1);
  Add(scheduler, 2, 30, 2);
  Add(scheduler, 2, 1, 3);
  auto slices = scheduler.NextIteration();
  ASSERT_EQ(slices.size(), 1u);  // Key 1's first chunk took the whole budget.
  EXPECT_EQ(slices[0].item->id, 0);
  std::unique_ptr<Work> head = scheduler.Remove(1);
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->id, 0);
  EXPECT_EQ(scheduler.KeySize(1), 1);
  auto all = scheduler.RemoveKey(2);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0]->id, 2);
  EXPECT_EQ(all[1]->id, 3);
  EXPECT_EQ(scheduler.size(), 1);
  slices = scheduler.NextIteration();
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0].finished->id, 1);
  EXPECT_TRUE(scheduler.empty());
  EXPECT_EQ(scheduler.Remove(1), nullptr);
}

}  // namespace
}  // namespace attnserve::batching
