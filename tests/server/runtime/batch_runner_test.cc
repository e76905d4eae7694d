// BatchRunner: a batch of several requests is one forward pass whose rows go back to the right
// requests, with the batch's timing; one request whose values overflow fp32 fails alone while its
// batch neighbours still get their answers.
#include "server/runtime/batch_runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "core/forward/attention_weights.h"
#include "server/batching/fake_clock.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using server::AttendResult;
using server::AttendTask;
using server::AttendWork;

std::shared_ptr<const model::Model> SmallModel() {
  auto model = std::make_shared<model::Model>();
  model->name = "small";
  model->config.attention = {.d_model = kSmallWidth,
                             .num_heads = kSmallHeads,
                             .variant = core::AttentionVariant::kMultiHead,
                             .bias = true};
  auto layer = core::AttentionLayer::Create(model->config.attention,
                                            core::MakeRandomWeights(model->config.attention, 11));
  EXPECT_TRUE(layer.ok()) << layer.status();
  model->layer = *layer;
  return model;
}

// A task whose answer lands in `answer`.
std::unique_ptr<AttendTask> Task(const std::shared_ptr<const model::Model>& model,
                                 std::vector<float> query, bool weights,
                                 std::optional<absl::StatusOr<AttendResult>>* answer) {
  AttendWork work;
  work.model = model;
  const int64_t rows = static_cast<int64_t>(query.size()) / kSmallWidth;
  work.query = std::move(query);
  work.query_lengths = {rows};
  work.padded_query_length = rows;
  work.padded_memory_length = rows;
  work.return_weights = weights;
  return std::make_unique<AttendTask>(
      std::move(work), batching::kNoDeadline, nullptr,
      [answer](const AttendWork&, absl::StatusOr<AttendResult> result) {
        *answer = std::move(result);
      });
}

server::BatchRunner::Batch MakeBatch(std::vector<std::unique_ptr<AttendTask>> tasks,
                                     std::vector<int64_t> enqueue_us) {
  server::BatchRunner::Batch batch;
  for (auto& task : tasks) {
    batch.sequences += task->sequences();
    batch.tokens += task->tokens();
    batch.tasks.push_back(std::move(task));
  }
  batch.enqueue_us = std::move(enqueue_us);
  return batch;
}

TEST(BatchRunnerTest, EachRequestGetsItsOwnRowsOfOneForwardPass) {
  const auto model = SmallModel();
  batching::FakeClock clock(1000);
  server::BatchRunner runner({.compute_threads = 1}, &clock);
  const std::vector<int64_t> lengths = {3, 1, 5};
  std::vector<std::optional<absl::StatusOr<AttendResult>>> answers(lengths.size());
  std::vector<std::unique_ptr<AttendTask>> tasks;
  for (size_t i = 0; i < lengths.size(); ++i) {
    tasks.push_back(
        Task(model, TestValues(lengths[i] * kSmallWidth, 20 + i), /*weights=*/true, &answers[i]));
  }
  runner.Run(MakeBatch(std::move(tasks), {700, 800, 990}));
  for (size_t i = 0; i < lengths.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(answers[i].has_value());
    ASSERT_TRUE(answers[i]->ok()) << answers[i]->status();
    const AttendResult& result = **answers[i];
    const CoreAnswer expected = CoreCompute(
        *model->layer, {.query = TestValues(lengths[i] * kSmallWidth, 20 + i), .weights = true});
    EXPECT_TRUE(Near({result.output.begin(), result.output.end()}, expected.output));
    EXPECT_TRUE(Near({result.weights.begin(), result.weights.end()}, expected.weights));
    EXPECT_EQ(result.timing.batch_sequences, 3);
    EXPECT_EQ(result.timing.batch_tokens, 9);
    EXPECT_NE(result.storage, nullptr);
  }
  // The fake clock stands still: queue time is batch start (1000) minus each enqueue time.
  EXPECT_EQ((*answers[0])->timing.queue_us, 300);
  EXPECT_EQ((*answers[2])->timing.queue_us, 10);
}

TEST(BatchRunnerTest, AnOverflowingRequestFailsAloneAndItsNeighboursAreAnswered) {
  const auto model = SmallModel();
  server::BatchRunner runner({.compute_threads = 1});
  std::vector<float> huge(4 * kSmallWidth, 3e37f);  // Finite, but its scores overflow fp32.
  std::vector<std::optional<absl::StatusOr<AttendResult>>> answers(3);
  std::vector<std::unique_ptr<AttendTask>> tasks;
  tasks.push_back(Task(model, TestValues(2 * kSmallWidth, 1), false, &answers[0]));
  tasks.push_back(Task(model, huge, false, &answers[1]));
  tasks.push_back(Task(model, TestValues(3 * kSmallWidth, 2), false, &answers[2]));
  runner.Run(MakeBatch(std::move(tasks), {0, 0, 0}));

  ASSERT_TRUE(answers[1].has_value());
  EXPECT_EQ(answers[1]->status().code(), absl::StatusCode::kOutOfRange);
  for (int i : {0, 2}) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(answers[i].has_value());
    ASSERT_TRUE(answers[i]->ok()) << answers[i]->status();
    const std::vector<float> query = TestValues((i == 0 ? 2 : 3) * kSmallWidth, i == 0 ? 1 : 2);
    EXPECT_TRUE(Near({(*answers[i])->output.begin(), (*answers[i])->output.end()},
                     CoreCompute(*model->layer, {.query = query}).output));
    EXPECT_EQ((*answers[i])->timing.batch_sequences, 1);  // Re-run alone.
  }
}

TEST(BatchRunnerTest, SmallBatchesRunOnOneThreadLargeOnesOnAll) {
  // Observable through the answers only as equal results; what matters here is that both paths
  // (a one-thread team and a two-thread team) compute the same thing.
  const auto model = SmallModel();
  std::vector<float> query = TestValues(64 * kSmallWidth, 5);
  std::vector<std::vector<float>> outputs;
  for (int64_t min_mflop : {0, 1000000}) {
    server::BatchRunner runner({.compute_threads = 2, .parallel_min_mflop = min_mflop});
    std::optional<absl::StatusOr<AttendResult>> answer;
    std::vector<std::unique_ptr<AttendTask>> tasks;
    tasks.push_back(Task(model, query, false, &answer));
    runner.Run(MakeBatch(std::move(tasks), {0}));
    ASSERT_TRUE(answer.has_value() && answer->ok());
    outputs.emplace_back((*answer)->output.begin(), (*answer)->output.end());
  }
  EXPECT_TRUE(Near(outputs[0], outputs[1]));
  EXPECT_TRUE(Near(outputs[0], CoreCompute(*model->layer, {.query = query}).output));
}

}  // namespace
}  // namespace attnserve::testing
