// SharedBatchScheduler and BatchQueue: batch formation (limits, delay, keys, FIFO, first fit),
// admission (queue full, oversized, inadmissible), timestamps, drain, option updates,
// concurrency, and the sharing itself: fairness between queues and a thread count that does not
// grow with the number of queues.
//
// Time is a FakeClock: a test knows a batch thread has looked at the queue and gone to wait when
// the clock reports a waiter with the expected deadline. Nothing sleeps; waits for results are
// notifications bounded by kTimeout so a broken scheduler fails instead of hanging.
#include "server/batching/shared_batch_scheduler.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/util/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/batching/batching_options.h"
#include "server/batching/clock.h"
#include "server/batching/fake_clock.h"
#include "tests/support/thread_names.h"

namespace attnserve::batching::shared_batch_scheduler_test {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr int64_t kLongDelayUs = 1'000'000'000;  // Never reached unless a test advances to it.

struct TestTask {
  int id = 0;
  int64_t num_sequences = 1;
  int64_t num_tokens = 1;
  int64_t num_bytes = 0;
  std::string key = "k";
  int64_t deadline_us = kNoDeadline;  // Inadmissible (DeadlineExceeded) from this time on.
  absl::Status admissible;            // Returned by CheckAdmissible when not OK.

  int64_t sequences() const { return num_sequences; }
  int64_t tokens() const { return num_tokens; }
  int64_t bytes() const { return num_bytes; }
  const std::string& batch_key() const { return key; }
  absl::Status CheckAdmissible(int64_t now_us) const {
    if (!admissible.ok()) return admissible;
    if (now_us >= deadline_us) return absl::DeadlineExceededError(absl::StrCat("task ", id));
    return absl::OkStatus();
  }
};

using TestQueue = BatchQueue<TestTask>;
using TestScheduler = SharedBatchScheduler<TestTask>;

std::unique_ptr<TestTask> MakeTask(int id, int64_t sequences = 1, int64_t tokens = 1,
                                   std::string key = "k") {
  auto task = std::make_unique<TestTask>();
  task->id = id;
  task->num_sequences = sequences;
  task->num_tokens = tokens;
  task->key = std::move(key);
  return task;
}

// A one-sequence, one-token task holding `bytes` of the queues' byte budgets.
std::unique_ptr<TestTask> SizedTask(int id, int64_t bytes) {
  auto task = MakeTask(id);
  task->num_bytes = bytes;
  return task;
}

// What process_batch received, without the tasks.
struct RecordedBatch {
  std::vector<int> ids;
  std::vector<std::string> keys;
  std::vector<int64_t> enqueue_us;
  int64_t start_us = 0;
  int64_t sequences = 0;
  int64_t tokens = 0;
};

struct RecordedDrop {
  int id = 0;
  absl::Status status;
};

// Collects batches and drops from the batch threads; tests wait on it with a bound.
class Recorder {
 public:
  void Record(Batch<TestTask> batch) {
    RecordedBatch recorded;
    recorded.enqueue_us = batch.enqueue_us;
    recorded.start_us = batch.start_us;
    recorded.sequences = batch.sequences;
    recorded.tokens = batch.tokens;
    for (const auto& task : batch.tasks) {
      recorded.ids.push_back(task->id);
      recorded.keys.push_back(task->key);
    }
    std::lock_guard<std::mutex> lock(mu_);
    batches_.push_back(std::move(recorded));
    changed_.notify_all();
  }
  void Drop(std::unique_ptr<TestTask> task, absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    drops_.push_back({task->id, std::move(status)});
    changed_.notify_all();
  }

  TestQueue::ProcessBatchFn ProcessFn() {
    return [this](Batch<TestTask> batch) { Record(std::move(batch)); };
  }
  TestQueue::DropTaskFn DropFn() {
    return [this](std::unique_ptr<TestTask> task, absl::Status status) {
      Drop(std::move(task), std::move(status));
    };
  }

  bool WaitForBatches(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return batches_.size() >= n; };
    return changed_.wait_for(lock, absl::ToChronoNanoseconds(kTimeout), enough);
  }
  bool WaitForDrops(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return drops_.size() >= n; };
    return changed_.wait_for(lock, absl::ToChronoNanoseconds(kTimeout), enough);
  }
  std::vector<RecordedBatch> batches() {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }
  std::vector<RecordedDrop> drops() {
    std::lock_guard<std::mutex> lock(mu_);
    return drops_;
  }
  std::vector<std::vector<int>> batch_ids() {
    std::vector<std::vector<int>> ids;
    for (const RecordedBatch& batch : batches()) ids.push_back(batch.ids);
    return ids;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;  // Signalled when a batch or drop is recorded.
  std::vector<RecordedBatch> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<RecordedDrop> drops_ ABSL_GUARDED_BY(mu_);
};

class SharedBatchSchedulerTest : public ::testing::Test {
 protected:
  // Declared before queue_, so all outlive it (its destructor drains into the recorder).
  FakeClock clock_{0};
  Recorder recorder_;
  Notification held_started_;
  Notification release_held_;
  int threads_ = 1;  // The scheduler's batch threads, read by Start.
  std::unique_ptr<TestScheduler> scheduler_;
  std::unique_ptr<TestQueue> queue_;

  void Start(const BatchingOptions& options) { Start(options, recorder_.ProcessFn()); }
  void Start(const BatchingOptions& options, TestQueue::ProcessBatchFn process) {
    scheduler_ = std::make_unique<TestScheduler>(
        SharedBatchSchedulerOptions{.num_batch_threads = threads_}, &clock_);
    auto queue = scheduler_->AddQueue(options, std::move(process), recorder_.DropFn());
    ASSERT_TRUE(queue.ok()) << queue.status();
    queue_ = *std::move(queue);
  }

  // Starts a queue whose batch thread, on the batch led by task `held_id`, stops until
  // release_held_ is notified (held_started_ tells when it got there): nothing but Schedule looks
  // at the queue meanwhile. Every batch is recorded.
  void StartHolding(const BatchingOptions& options, int held_id) {
    Start(options, [this, held_id](Batch<TestTask> batch) {
      if (batch.tasks[0]->id == held_id) {
        held_started_.Notify();
        release_held_.WaitForNotification();
      }
      recorder_.Record(std::move(batch));
    });
  }
  // A failed assertion must not leave a batch thread held while the queue drains.
  void TearDown() override {
    if (!release_held_.HasBeenNotified()) release_held_.Notify();
  }

  absl::Status Schedule(std::unique_ptr<TestTask> task) { return queue_->Schedule(&task); }

  // True once a batch thread has examined the queue and decided to wait until deadline_us.
  bool ThreadWaitsUntil(int64_t deadline_us) {
    return clock_.BlockUntilWaiterWithDeadline(deadline_us, kTimeout);
  }
};

TEST_F(SharedBatchSchedulerTest, ReleasedWhenSequencesLimitReached) {
  Start({.max_batch_sequences = 4, .max_queue_delay_us = kLongDelayUs});
  ASSERT_TRUE(Schedule(MakeTask(1)).ok());
  ASSERT_TRUE(Schedule(MakeTask(2)).ok());
  ASSERT_TRUE(ThreadWaitsUntil(kLongDelayUs));
  EXPECT_THAT(recorder_.batches(), IsEmpty());  // 2 of 4 sequences: not full.
  EXPECT_EQ(queue_->QueueSize(), 2);

  ASSERT_TRUE(Schedule(MakeTask(3, /*sequences=*/2)).ok());  // Exactly 4.
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  const RecordedBatch batch = recorder_.batches()[0];
  EXPECT_THAT(batch.ids, ElementsAre(1, 2, 3));
  EXPECT_EQ(batch.sequences, 4);
  EXPECT_EQ(batch.tokens, 3);
  EXPECT_EQ(batch.start_us, 0);  // Released by size: the clock never moved.
  EXPECT_EQ(queue_->QueueSize(), 0);
}

TEST_F(SharedBatchSchedulerTest, ReleasedWhenNextTaskWouldPassTokensLimit) {
  Start({.max_batch_tokens = 10, .max_queue_delay_us = kLongDelayUs});
  ASSERT_TRUE(Schedule(MakeTask(1, 1, /*tokens=*/4)).ok());
  ASSERT_TRUE(Schedule(MakeTask(2, 1, /*tokens=*/4)).ok());
  ASSERT_TRUE(ThreadWaitsUntil(kLongDelayUs));
  EXPECT_THAT(recorder_.batches(), IsEmpty());

  ASSERT_TRUE(Schedule(MakeTask(3, 1, /*tokens=*/4)).ok());  // 12 > 10: 1 and 2 are full.
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(1, 2)));
  EXPECT_EQ(recorder_.batches()[0].tokens, 8);
  EXPECT_EQ(queue_->QueueSize(), 1);  // Task 3 waits for its own batch...

  ASSERT_TRUE(ThreadWaitsUntil(kLongDelayUs));
  clock_.AdvanceMicros(kLongDelayUs);  // ...which its delay releases.
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  EXPECT_THAT(recorder_.batches()[1].ids, ElementsAre(3));
  EXPECT_EQ(recorder_.batches()[1].start_us, kLongDelayUs);
}

TEST_F(SharedBatchSchedulerTest, ReleasedWhenTokensLimitReachedExactly) {
  Start({.max_batch_tokens = 8, .max_queue_delay_us = kLongDelayUs});
  ASSERT_TRUE(Schedule(MakeTask(1, 1, /*tokens=*/5)).ok());
  ASSERT_TRUE(ThreadWaitsUntil(kLongDelayUs));
  ASSERT_TRUE(Schedule(MakeTask(2, 1, /*tokens=*/3)).ok());
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(1, 2)));
}

TEST_F(SharedBatchSchedulerTest, ReleasedAfterMaxQueueDelayAndNotBefore) {
  Start({.max_batch_sequences = 10, .max_queue_delay_us = 100});
  ASSERT_TRUE(Schedule(MakeTask(1)).ok());
  ASSERT_TRUE(ThreadWaitsUntil(100));  // The oldest task's enqueue time + delay.
  clock_.AdvanceMicros(50);
  ASSERT_TRUE(Schedule(MakeTask(2)).ok());
  clock_.AdvanceMicros(49);  // 99: one microsecond short.
  // A full batch of another key makes the thread look at the queue at 99: it must run that
  // batch and leave tasks 1 and 2 waiting.
  ASSERT_TRUE(Schedule(MakeTask(3, /*sequences=*/10, 1, "other")).ok());
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  ASSERT_TRUE(ThreadWaitsUntil(100));
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(3)));
  EXPECT_EQ(recorder_.batches()[0].start_us, 99);
  EXPECT_EQ(queue_->QueueSize(), 2);

  clock_.AdvanceMicros(1);
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  const RecordedBatch batch = recorder_.batches()[1];
  EXPECT_THAT(batch.ids, ElementsAre(1, 2));
  EXPECT_THAT(batch.enqueue_us, ElementsAre(0, 50));
  EXPECT_EQ(batch.start_us, 100);
}

TEST_F(SharedBatchSchedulerTest, TimestampsComeFromTheClock) {
  clock_.SetMicros(1000);
  Start({.max_queue_delay_us = 100});
  ASSERT_TRUE(Schedule(MakeTask(1)).ok());
  clock_.AdvanceMicros(30);
  ASSERT_TRUE(Schedule(MakeTask(2)).ok());
  ASSERT_TRUE(ThreadWaitsUntil(1100));
  clock_.AdvanceMicros(170);  // Past the deadline: the batch starts at the time it is formed.
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batches()[0].enqueue_us, ElementsAre(1000, 1030));
  EXPECT_EQ(recorder_.batches()[0].start_us, 1200);
}

TEST_F(SharedBatchSchedulerTest, ZeroDelayRunsAtOnce) {
  Start({.max_queue_delay_us = 0});
  ASSERT_TRUE(Schedule(MakeTask(1)).ok());
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  ASSERT_TRUE(Schedule(MakeTask(2)).ok());
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(1), ElementsAre(2)));
  EXPECT_EQ(recorder_.batches()[1].start_us, 0);
  EXPECT_EQ(clock_.NowMicros(), 0);
}

TEST_F(SharedBatchSchedulerTest, KeysNeverShareABatchAndEachKeyKeepsArrivalOrder) {
  Start({.max_queue_delay_us = kLongDelayUs});
  ASSERT_TRUE(Schedule(MakeTask(1, 1, 1, "a")).ok());
  ASSERT_TRUE(Schedule(MakeTask(2, 1, 1, "b")).ok());
  ASSERT_TRUE(Schedule(MakeTask(3, 1, 1, "a")).ok());
  ASSERT_TRUE(Schedule(MakeTask(4, 1, 1, "b")).ok());
  ASSERT_TRUE(Schedule(MakeTask(5, 1, 1, "a")).ok());
  ASSERT_TRUE(Schedule(MakeTask(6, 1, 1, "c")).ok());
  ASSERT_TRUE(ThreadWaitsUntil(kLongDelayUs));
  clock_.AdvanceMicros(kLongDelayUs);
  ASSERT_TRUE(recorder_.WaitForBatches(3));
  // One thread: keys go in the order of their oldest task.
  EXPECT_THAT(recorder_.batch_ids(),
              ElementsAre(ElementsAre(1, 3, 5), ElementsAre(2, 4), ElementsAre(6)));
  for (const RecordedBatch& batch : recorder_.batches()) {
    for (const std::string& key : batch.keys) EXPECT_EQ(key, batch.keys[0]);
  }
}

TEST_F(SharedBatchSchedulerTest, FullBatchOfYoungerKeyDoesNotWaitForOlderKey) {
  Start({.max_batch_sequences = 2, .max_queue_delay_us = kLongDelayUs});
  ASSERT_TRUE(Schedule(MakeTask(1, 1, 1, "a")).ok());
  ASSERT_TRUE(Schedule(MakeTask(2, 1, 1, "b")).ok());
  ASSERT_TRUE(Schedule(MakeTask(3, 1, 1, "b")).ok());
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(2, 3)));
  EXPECT_EQ(queue_->QueueSize(), 1);
}

TEST_F(SharedBatchSchedulerTest, TasksThatDoNotFitStayQueuedInOrderForTheNextBatch) {
  // Hold the only thread in a batch of another key so that all four tasks are queued before it
  // looks (otherwise task 2 alone would make the key full and release task 1 by itself).
  StartHolding({.max_batch_sequences = 4, .max_queue_delay_us = 0}, /*held_id=*/0);
  ASSERT_TRUE(Schedule(MakeTask(0, 1, 1, "blocker")).ok());
  ASSERT_TRUE(held_started_.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_TRUE(Schedule(MakeTask(1, /*sequences=*/3)).ok());
  ASSERT_TRUE(Schedule(MakeTask(2, /*sequences=*/2)).ok());
  ASSERT_TRUE(Schedule(MakeTask(3, /*sequences=*/2)).ok());
  ASSERT_TRUE(Schedule(MakeTask(4, /*sequences=*/1)).ok());
  release_held_.Notify();
  ASSERT_TRUE(recorder_.WaitForBatches(3));
  // First fit: 1 then 4 (2 and 3 do not fit next to 1); 2 and 3, still in order, fill the next.
  EXPECT_THAT(recorder_.batch_ids(),
              ElementsAre(ElementsAre(0), ElementsAre(1, 4), ElementsAre(2, 3)));
}

TEST_F(SharedBatchSchedulerTest, FullQueueIsRejectedAtOnceAndCallerKeepsTheTask) {
  Start({.max_queue_delay_us = kLongDelayUs, .max_queue_size = 2});
  ASSERT_TRUE(Schedule(MakeTask(1)).ok());
  ASSERT_TRUE(Schedule(MakeTask(2)).ok());
  auto task = MakeTask(3);
  absl::Status status = queue_->Schedule(&task);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("max_queue_size (2)"));
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->id, 3);
  EXPECT_EQ(queue_->QueueSize(), 2);

  queue_->Drain();
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(1, 2)));
}

TEST_F(SharedBatchSchedulerTest, AFullQueueFirstDropsTasksThatMayNoLongerRun) {
  // The only thread is held in a batch, so nothing but Schedule looks at the queue.
  // One-sequence batches are full at once, so the blocker runs without waiting for the delay.
  StartHolding({.max_batch_sequences = 1, .max_queue_delay_us = kLongDelayUs, .max_queue_size = 2},
               /*held_id=*/0);
  ASSERT_TRUE(Schedule(MakeTask(0, 1, 1, "blocker")).ok());
  ASSERT_TRUE(held_started_.WaitForNotificationWithTimeout(kTimeout));
  for (int id : {1, 2}) {
    auto expiring = MakeTask(id);
    expiring->deadline_us = 50;
    ASSERT_TRUE(Schedule(std::move(expiring)).ok());
  }
  auto live = MakeTask(3);
  EXPECT_EQ(queue_->Schedule(&live).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_NE(live, nullptr);

  clock_.AdvanceMicros(60);  // Tasks 1 and 2 are past their deadline, still queued.
  EXPECT_TRUE(queue_->Schedule(&live).ok());
  EXPECT_EQ(queue_->QueueSize(), 1);
  release_held_.Notify();
  ASSERT_TRUE(recorder_.WaitForDrops(2));
  for (const RecordedDrop& drop : recorder_.drops()) {
    EXPECT_EQ(drop.status.code(), absl::StatusCode::kDeadlineExceeded) << drop.id;
  }
  queue_->Drain();
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(0), ElementsAre(3)));
}

TEST_F(SharedBatchSchedulerTest, OversizedOrMalformedTasksAreInvalidAndKeptByCaller) {
  Start({.max_batch_sequences = 4, .max_batch_tokens = 10});
  auto too_many_sequences = MakeTask(1, /*sequences=*/5);
  absl::Status status = queue_->Schedule(&too_many_sequences);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("5 sequences"), HasSubstr("max_batch_sequences (4)")));
  EXPECT_NE(too_many_sequences, nullptr);

  auto too_many_tokens = MakeTask(2, 1, /*tokens=*/11);
  status = queue_->Schedule(&too_many_tokens);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("11 tokens"), HasSubstr("max_batch_tokens (10)")));
  EXPECT_NE(too_many_tokens, nullptr);

  auto empty = MakeTask(3, /*sequences=*/0);
  EXPECT_EQ(queue_->Schedule(&empty).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty, nullptr);
  std::unique_ptr<TestTask> null;
  EXPECT_EQ(queue_->Schedule(&null).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(queue_->Schedule(nullptr).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(queue_->QueueSize(), 0);
  queue_->Drain();
  EXPECT_THAT(recorder_.batches(), IsEmpty());
}

TEST_F(SharedBatchSchedulerTest, InadmissibleTasksAreDroppedWithTheirStatusAndNeverProcessed) {
  Start({.max_queue_delay_us = 100});
  auto expiring = MakeTask(1);
  expiring->deadline_us = 50;
  auto cancelled = MakeTask(3);
  cancelled->admissible = absl::CancelledError("client went away");
  ASSERT_TRUE(Schedule(std::move(expiring)).ok());
  ASSERT_TRUE(Schedule(MakeTask(2)).ok());
  ASSERT_TRUE(Schedule(std::move(cancelled)).ok());
  ASSERT_TRUE(ThreadWaitsUntil(100));
  EXPECT_THAT(recorder_.batches(), IsEmpty());

  clock_.AdvanceMicros(100);  // Task 1's deadline (50) has passed by the time its batch forms.
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  ASSERT_TRUE(recorder_.WaitForDrops(2));
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(2)));
  std::vector<RecordedDrop> drops = recorder_.drops();
  ASSERT_EQ(drops.size(), 2u);
  // Task 3 may go at the first look (if the thread saw it) or with task 1.
  if (drops[0].id != 1) std::swap(drops[0], drops[1]);
  EXPECT_EQ(drops[0].id, 1);
  EXPECT_EQ(drops[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(drops[1].id, 3);
  EXPECT_EQ(drops[1].status, absl::CancelledError("client went away"));
}

TEST_F(SharedBatchSchedulerTest, InadmissibleTasksDoNotMakeABatchFull) {
  Start({.max_batch_sequences = 2, .max_queue_delay_us = kLongDelayUs});
  auto cancelled = MakeTask(2);
  cancelled->admissible = absl::CancelledError("cancelled");
  ASSERT_TRUE(Schedule(MakeTask(1)).ok());
  ASSERT_TRUE(Schedule(std::move(cancelled)).ok());  // 2 sequences queued: wakes the thread...
  ASSERT_TRUE(recorder_.WaitForDrops(1));
  ASSERT_TRUE(ThreadWaitsUntil(kLongDelayUs));  // ...which drops task 2 and waits for more.
  EXPECT_THAT(recorder_.batches(), IsEmpty());
  EXPECT_EQ(queue_->QueueSize(), 1);
}

TEST_F(SharedBatchSchedulerTest, DrainRunsEveryQueuedTaskWithoutWaitingForTheDelay) {
  Start({.max_batch_sequences = 2, .max_queue_delay_us = kLongDelayUs});
  for (int id = 0; id < 5; ++id) ASSERT_TRUE(Schedule(MakeTask(id)).ok());
  for (int id = 5; id < 8; ++id) ASSERT_TRUE(Schedule(MakeTask(id, 1, 1, "other")).ok());
  auto doomed = MakeTask(8);
  doomed->admissible = absl::CancelledError("cancelled");
  ASSERT_TRUE(Schedule(std::move(doomed)).ok());

  queue_->Drain();
  EXPECT_EQ(clock_.NowMicros(), 0);
  std::vector<int> times_processed(8, 0);
  for (const RecordedBatch& batch : recorder_.batches()) {
    EXPECT_LE(batch.sequences, 2);
    EXPECT_EQ(batch.start_us, 0);
    for (int id : batch.ids) ++times_processed[id];
  }
  EXPECT_THAT(times_processed, ::testing::Each(1));
  ASSERT_EQ(recorder_.drops().size(), 1u);
  EXPECT_EQ(recorder_.drops()[0].id, 8);
  EXPECT_EQ(queue_->QueueSize(), 0);

  auto late = MakeTask(9);
  EXPECT_EQ(queue_->Schedule(&late).code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(late, nullptr);
  queue_->Drain();  // Idempotent.
}

TEST_F(SharedBatchSchedulerTest, DestructorDrains) {
  Start({.max_queue_delay_us = kLongDelayUs});
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(Schedule(MakeTask(id)).ok());
  queue_.reset();
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(0, 1, 2)));
}

TEST_F(SharedBatchSchedulerTest, ConcurrentDrainsAllReturnDrained) {
  Start({.max_queue_delay_us = kLongDelayUs});
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(Schedule(MakeTask(id)).ok());
  std::thread other([this] { queue_->Drain(); });
  queue_->Drain();
  EXPECT_EQ(recorder_.batches().size(), 1u);  // Drain returned: everything has run.
  other.join();
}

TEST_F(SharedBatchSchedulerTest, UpdateOptionsTakesEffectForTheNextBatch) {
  Start({.max_batch_sequences = 10, .max_queue_delay_us = kLongDelayUs});
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(Schedule(MakeTask(id)).ok());
  ASSERT_TRUE(ThreadWaitsUntil(kLongDelayUs));
  // A smaller limit makes the queued tasks a full batch.
  ASSERT_TRUE(
      queue_->UpdateOptions({.max_batch_sequences = 3, .max_queue_delay_us = kLongDelayUs}).ok());
  ASSERT_TRUE(recorder_.WaitForBatches(1));
  EXPECT_THAT(recorder_.batches()[0].ids, ElementsAre(0, 1, 2));
  EXPECT_EQ(queue_->options().max_batch_sequences, 3);

  auto big = MakeTask(10, /*sequences=*/4);
  EXPECT_THAT(queue_->Schedule(&big).message(), HasSubstr("max_batch_sequences (3)"));

  // A shorter delay releases a waiting batch.
  ASSERT_TRUE(Schedule(MakeTask(3)).ok());
  ASSERT_TRUE(ThreadWaitsUntil(kLongDelayUs));
  ASSERT_TRUE(queue_->UpdateOptions({.max_queue_delay_us = 0}).ok());
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  EXPECT_THAT(recorder_.batches()[1].ids, ElementsAre(3));
  EXPECT_EQ(recorder_.batches()[1].start_us, 0);

  // Invalid options are refused and change nothing.
  absl::Status status = queue_->UpdateOptions({.max_queue_size = 0});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("max_queue_size"));
  EXPECT_EQ(queue_->options().max_queue_size, 1024);
  EXPECT_EQ(queue_->options().max_queue_delay_us, 0);
}

// While the only batch thread is busy, tasks accumulate; when it returns it takes them together.
TEST_F(SharedBatchSchedulerTest, TasksAccumulateWhileTheThreadIsBusy) {
  StartHolding({.max_queue_delay_us = 0}, /*held_id=*/1);
  ASSERT_TRUE(Schedule(MakeTask(1)).ok());
  ASSERT_TRUE(held_started_.WaitForNotificationWithTimeout(kTimeout));
  for (int id = 2; id <= 4; ++id) ASSERT_TRUE(Schedule(MakeTask(id)).ok());
  EXPECT_EQ(queue_->QueueSize(), 3);
  release_held_.Notify();
  ASSERT_TRUE(recorder_.WaitForBatches(2));
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(1), ElementsAre(2, 3, 4)));
}

TEST_F(SharedBatchSchedulerTest, SeveralThreadsRunBatchesConcurrently) {
  threads_ = 2;
  StartHolding({.max_queue_delay_us = 0}, /*held_id=*/1);
  ASSERT_TRUE(Schedule(MakeTask(1)).ok());
  ASSERT_TRUE(held_started_.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_TRUE(Schedule(MakeTask(2)).ok());
  ASSERT_TRUE(recorder_.WaitForBatches(1));  // The second thread, while the first is blocked.
  EXPECT_THAT(recorder_.batch_ids(), ElementsAre(ElementsAre(2)));
  release_held_.Notify();
  ASSERT_TRUE(recorder_.WaitForBatches(2));
}

TEST(SharedBatchSchedulerCreateTest, AddQueueRefusesInvalidOptionsAndThreadsAreRaisedToOne) {
  Recorder recorder;
  TestScheduler scheduler({.num_batch_threads = 0});
  EXPECT_EQ(scheduler.num_batch_threads(), 1);
  auto refused =
      scheduler.AddQueue({.max_batch_tokens = 0}, recorder.ProcessFn(), recorder.DropFn());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("max_batch_tokens"));

  auto created = scheduler.AddQueue({}, recorder.ProcessFn(), recorder.DropFn());
  ASSERT_TRUE(created.ok());
  EXPECT_EQ((*created)->options().max_batch_tokens, 8192);
}

// Real clock, several producers: every task is processed exactly once, batches respect the
// limits and keys, and each producer's tasks keep their order within a batch.
class SharedBatchSchedulerStressTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SharedBatchSchedulerStressTest, EveryTaskProcessedExactlyOnce) {
  constexpr int kProducers = 4;
  constexpr int kTasksPerProducer = 500;
  constexpr int kTasks = kProducers * kTasksPerProducer;
  const BatchingOptions options{.max_batch_sequences = 8,
                                .max_batch_tokens = 40,
                                .max_queue_delay_us = GetParam(),
                                .max_queue_size = kTasks};
  std::vector<std::atomic<int>> times_processed(kTasks);
  std::atomic<int> bad_batches{0};
  std::atomic<int> dropped{0};
  TestScheduler scheduler({.num_batch_threads = 2});
  {
    absl::StatusOr<std::unique_ptr<TestQueue>> made = scheduler.AddQueue(
        options,
        [&](Batch<TestTask> batch) {
          bool ok = !batch.tasks.empty() && batch.sequences <= options.max_batch_sequences &&
                    batch.tokens <= options.max_batch_tokens &&
                    batch.enqueue_us.size() == batch.tasks.size();
          std::vector<int> last_id(kProducers, -1);
          int64_t sequences = 0;
          for (const auto& task : batch.tasks) {
            ok = ok && task->key == batch.tasks[0]->key;
            const int producer = task->id / kTasksPerProducer;
            ok = ok && task->id > last_id[producer];
            last_id[producer] = task->id;
            sequences += task->sequences();
            times_processed[task->id].fetch_add(1);
          }
          ok = ok && sequences == batch.sequences && batch.start_us >= batch.enqueue_us.back();
          if (!ok) bad_batches.fetch_add(1);
        },
        [&](std::unique_ptr<TestTask>, absl::Status) { dropped.fetch_add(1); });
    ASSERT_TRUE(made.ok()) << made.status();
    TestQueue& queue = **made;

    Notification go;
    std::atomic<int> refused{0};
    std::vector<std::thread> producers;
    for (int p = 0; p < kProducers; ++p) {
      producers.emplace_back([&, p] {
        go.WaitForNotification();
        for (int i = 0; i < kTasksPerProducer; ++i) {
          const int id = p * kTasksPerProducer + i;
          auto task = MakeTask(id, 1 + id % 3, 1 + id % 7, absl::StrCat("key", id % 3));
          if (!queue.Schedule(&task).ok()) refused.fetch_add(1);
        }
      });
    }
    go.Notify();
    for (std::thread& producer : producers) producer.join();
    EXPECT_EQ(refused.load(), 0);
  }  // The queue's destructor drains.
  EXPECT_EQ(bad_batches.load(), 0);
  EXPECT_EQ(dropped.load(), 0);
  int wrong = 0;
  for (const std::atomic<int>& count : times_processed) wrong += count.load() != 1;
  EXPECT_EQ(wrong, 0);
}

INSTANTIATE_TEST_SUITE_P(Delays, SharedBatchSchedulerStressTest, ::testing::Values(0, 200),
                         [](const ::testing::TestParamInfo<int64_t>& delay) {
                           return absl::StrCat("DelayUs", delay.param);
                         });

// ---------------------------------------------------------------------------------------------
// Sharing: several queues on one scheduler.

using ::attnserve::testing::CountThreadsNamed;

// A hot queue with a backlog cannot starve a cold one: the cold queue's lone task runs as soon as
// the hot batch in progress is done, before the rest of the hot backlog.
TEST(SharedBatchSchedulerSharingTest, AColdQueueWaitsForAtMostOneBatchOfAHotQueue) {
  for (const bool cold_first : {false, true}) {
    SCOPED_TRACE(cold_first ? "cold queue added first" : "hot queue added first");
    FakeClock clock(0);
    Recorder recorder;
    Notification held_started;
    Notification release_held;
    TestScheduler scheduler({.num_batch_threads = 1}, &clock);
    auto hold_first = [&](Batch<TestTask> batch) {
      if (batch.tasks[0]->id == 0) {
        held_started.Notify();
        release_held.WaitForNotification();
      }
      recorder.Record(std::move(batch));
    };
    std::unique_ptr<TestQueue> cold;
    if (cold_first) cold = *scheduler.AddQueue({}, recorder.ProcessFn(), recorder.DropFn());
    auto hot = *scheduler.AddQueue({.max_batch_sequences = 1}, hold_first, recorder.DropFn());
    if (!cold_first) cold = *scheduler.AddQueue({}, recorder.ProcessFn(), recorder.DropFn());

    for (int id = 0; id < 10; ++id) {
      auto task = MakeTask(id);
      ASSERT_TRUE(hot->Schedule(&task).ok());
    }
    ASSERT_TRUE(held_started.WaitForNotificationWithTimeout(kTimeout));
    auto lone = MakeTask(100);
    ASSERT_TRUE(cold->Schedule(&lone).ok());
    release_held.Notify();
    ASSERT_TRUE(recorder.WaitForBatches(11));
    const std::vector<std::vector<int>> order = recorder.batch_ids();
    EXPECT_THAT(order[0], ElementsAre(0));
    EXPECT_THAT(order[1], ElementsAre(100)) << "the cold task waited for more than one hot batch";
    EXPECT_THAT(order[2], ElementsAre(1));
  }
}

// Eight queues under load are served by the scheduler's two threads: the thread count does not
// grow with the number of queues (models).
TEST(SharedBatchSchedulerSharingTest, EightQueuesUnderLoadKeepTheThreadCount) {
  constexpr int kQueues = 8;
  constexpr int kTasksPerQueue = 200;
  const std::string name = "sbs-test-batch";
  ASSERT_EQ(CountThreadsNamed(name), 0);
  TestScheduler scheduler({.num_batch_threads = 2, .thread_name = name});
  EXPECT_EQ(CountThreadsNamed(name), 2);

  std::mutex mu;
  std::set<std::thread::id> ran_on;
  std::atomic<int> processed{0};
  std::atomic<int> max_threads_seen{0};
  auto process = [&](Batch<TestTask> batch) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ran_on.insert(std::this_thread::get_id());
    }
    const int threads = CountThreadsNamed(name);
    int seen = max_threads_seen.load();
    while (threads > seen && !max_threads_seen.compare_exchange_weak(seen, threads)) {
    }
    processed.fetch_add(static_cast<int>(batch.tasks.size()));
  };
  std::vector<std::unique_ptr<TestQueue>> queues;
  for (int q = 0; q < kQueues; ++q) {
    auto queue = scheduler.AddQueue({.max_batch_sequences = 4, .max_queue_size = kTasksPerQueue},
                                    process, [](std::unique_ptr<TestTask>, absl::Status) {});
    ASSERT_TRUE(queue.ok());
    queues.push_back(*std::move(queue));
  }
  Notification go;
  std::vector<std::thread> producers;
  std::atomic<int> refused{0};
  for (int q = 0; q < kQueues; ++q) {
    producers.emplace_back([&, q] {
      go.WaitForNotification();
      for (int i = 0; i < kTasksPerQueue; ++i) {
        auto task = MakeTask(q * kTasksPerQueue + i);
        if (!queues[q]->Schedule(&task).ok()) refused.fetch_add(1);
      }
    });
  }
  go.Notify();
  for (std::thread& producer : producers) producer.join();
  queues.clear();  // Each drains.

  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(processed.load(), kQueues * kTasksPerQueue);
  EXPECT_EQ(max_threads_seen.load(), 2);
  EXPECT_LE(ran_on.size(), 2u);
  EXPECT_EQ(CountThreadsNamed(name), 2);
}

// Draining one queue answers its tasks and refuses new ones; the other queues go on serving.
TEST(SharedBatchSchedulerSharingTest, DrainingOneQueueLeavesTheOthersServing) {
  FakeClock clock(0);
  Recorder recorder;
  TestScheduler scheduler({.num_batch_threads = 1}, &clock);
  auto leaving = *scheduler.AddQueue({.max_queue_delay_us = kLongDelayUs}, recorder.ProcessFn(),
                                     recorder.DropFn());
  auto staying = *scheduler.AddQueue({}, recorder.ProcessFn(), recorder.DropFn());
  for (int id = 0; id < 3; ++id) {
    auto task = MakeTask(id);
    ASSERT_TRUE(leaving->Schedule(&task).ok());
  }
  leaving->Drain();
  EXPECT_THAT(recorder.batch_ids(), ElementsAre(ElementsAre(0, 1, 2)));
  auto late = MakeTask(3);
  EXPECT_EQ(leaving->Schedule(&late).code(), absl::StatusCode::kUnavailable);

  auto other = MakeTask(4);
  ASSERT_TRUE(staying->Schedule(&other).ok());
  ASSERT_TRUE(recorder.WaitForBatches(2));
  EXPECT_THAT(recorder.batch_ids()[1], ElementsAre(4));
}

// The server-wide byte budget: counted over every queue, refused at once naming the limit, and
// given back as tasks leave the queues (in a batch, or dropped).
TEST(SharedBatchSchedulerSharingTest, QueuedBytesAreBoundedAcrossQueues) {
  FakeClock clock(0);
  Recorder recorder;
  TestScheduler scheduler({.num_batch_threads = 1, .max_queued_bytes = 1000}, &clock);
  EXPECT_EQ(scheduler.max_queued_bytes(), 1000);
  auto a = *scheduler.AddQueue({.max_queue_delay_us = kLongDelayUs}, recorder.ProcessFn(),
                               recorder.DropFn());
  auto b = *scheduler.AddQueue({.max_queue_delay_us = kLongDelayUs}, recorder.ProcessFn(),
                               recorder.DropFn());
  auto first = SizedTask(1, 600);
  ASSERT_TRUE(a->Schedule(&first).ok());
  // Admissible until t = 10 us: a batch thread must not drop it (and free its bytes) before the
  // refusal below is checked.
  auto doomed = SizedTask(2, 400);
  doomed->deadline_us = 10;
  ASSERT_TRUE(b->Schedule(&doomed).ok());  // Exactly at the budget.
  EXPECT_EQ(scheduler.QueuedBytes(), 1000);

  // Over the budget: refused at once, naming the limit, the bytes queued and the task's.
  auto over = SizedTask(3, 1);
  const absl::Status refused = a->Schedule(&over);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), AllOf(HasSubstr("max_queued_bytes (1000)"),
                                       HasSubstr("1000 bytes queued"), HasSubstr("holds 1")));
  ASSERT_NE(over, nullptr);  // Still the caller's.

  // Once its deadline passed, the task is dropped to make room (by Schedule, or by a batch thread
  // that got there first), and the newcomer admitted.
  clock.SetMicros(10);
  ASSERT_TRUE(b->Schedule(&over).ok());
  ASSERT_TRUE(recorder.WaitForDrops(1));
  EXPECT_EQ(recorder.drops()[0].id, 2);
  EXPECT_EQ(scheduler.QueuedBytes(), 601);

  // Tasks leaving in a batch give their bytes back.
  a->Drain();
  EXPECT_EQ(scheduler.QueuedBytes(), 1);
  b->Drain();
  EXPECT_EQ(scheduler.QueuedBytes(), 0);
}

// A task larger than a byte limit by itself can never be queued, however empty the queues are:
// InvalidArgument (not worth retrying), as a task past max_batch_tokens, not ResourceExhausted.
TEST(SharedBatchSchedulerSharingTest, ATaskLargerThanAByteLimitIsInvalid) {
  FakeClock clock(0);
  Recorder recorder;
  TestScheduler scheduler({.num_batch_threads = 1, .max_queued_bytes = 1000}, &clock);
  auto queue = *scheduler.AddQueue({.max_queue_delay_us = kLongDelayUs, .max_queued_bytes = 500},
                                   recorder.ProcessFn(), recorder.DropFn());
  auto unlimited = *scheduler.AddQueue({.max_queue_delay_us = kLongDelayUs}, recorder.ProcessFn(),
                                       recorder.DropFn());
  auto over_queue = SizedTask(1, 501);
  absl::Status refused = queue->Schedule(&over_queue);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("501 bytes"), HasSubstr("this queue's max_queued_bytes (500)")));
  ASSERT_NE(over_queue, nullptr);  // Still the caller's.

  auto over_server = SizedTask(2, 1001);
  refused = unlimited->Schedule(&over_server);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("1001 bytes"), HasSubstr("the server's max_queued_bytes (1000)")));

  // Exactly at a limit fits.
  auto at_limit = SizedTask(3, 500);
  EXPECT_TRUE(queue->Schedule(&at_limit).ok());
  EXPECT_EQ(scheduler.QueuedBytes(), 500);
  queue->Drain();
  unlimited->Drain();
}

// A queue's own byte limit: one model cannot take the server-wide budget from the others.
TEST(SharedBatchSchedulerSharingTest, AQueuesBytesAreBoundedByItsOwnLimit) {
  FakeClock clock(0);
  Recorder recorder;
  TestScheduler scheduler({.num_batch_threads = 1, .max_queued_bytes = 10'000}, &clock);
  auto flooded = *scheduler.AddQueue({.max_queue_delay_us = kLongDelayUs, .max_queued_bytes = 700},
                                     recorder.ProcessFn(), recorder.DropFn());
  auto other = *scheduler.AddQueue({.max_queue_delay_us = kLongDelayUs}, recorder.ProcessFn(),
                                   recorder.DropFn());
  auto first = SizedTask(1, 600);
  ASSERT_TRUE(flooded->Schedule(&first).ok());
  auto second = SizedTask(2, 200);
  const absl::Status refused = flooded->Schedule(&second);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("batch queue is at its memory limit: max_queued_bytes (700)"),
                    HasSubstr("600 bytes queued"), HasSubstr("holds 200")));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(flooded->QueuedBytes(), 600);

  // The other queue still has the rest of the server's budget.
  ASSERT_TRUE(other->Schedule(&second).ok());
  EXPECT_EQ(other->QueuedBytes(), 200);
  EXPECT_EQ(scheduler.QueuedBytes(), 800);

  // Raising the limit (a config reload) admits it; 0 means no per-queue limit.
  ASSERT_TRUE(
      flooded->UpdateOptions({.max_queue_delay_us = kLongDelayUs, .max_queued_bytes = 0}).ok());
  auto big = SizedTask(3, 5'000);
  ASSERT_TRUE(flooded->Schedule(&big).ok());
  EXPECT_EQ(flooded->QueuedBytes(), 5'600);
  flooded->Drain();
  other->Drain();
  EXPECT_EQ(scheduler.QueuedBytes(), 0);
  EXPECT_THAT(recorder.batch_ids(),
              ::testing::UnorderedElementsAre(ElementsAre(1, 3), ElementsAre(2)));
}

}  // namespace
}  // namespace attnserve::batching::shared_batch_scheduler_test
