// SharedBatchScheduler<Task> and BatchQueue<Task>: model-agnostic dynamic batching, after TF
// Serving's SharedBatchScheduler: one pool of batch threads serves the queues of every model.
//
// A queue per model (AddQueue) takes tasks (Schedule); the scheduler's batch threads group each
// queue's tasks into batches and hand every batch to that queue's `process_batch`. Nothing here
// knows what a task computes: it reads only a task's size, its batch key and whether it may
// still run. The thread count is the scheduler's alone: M models share N threads, never M×N.
//
// Batch formation, per queue. Tasks queue in arrival order (FIFO). A batch is formed for one
// batch key: it takes the oldest queued task of that key, then later tasks of the same key that
// still fit both max_batch_sequences and max_batch_tokens. A task that does not fit is skipped
// and keeps its place in the queue (it will be the oldest of a later batch, so it cannot starve);
// tasks of other keys are never mixed in. A key's batch is ready when
//   - it is full: its queued tasks reach a limit (so the next one would not fit), or
//   - its oldest task has waited max_queue_delay_us, or
//   - the queue is draining.
// Within a queue, keys are considered in the order of their oldest task, so a full batch of a
// younger key does not wait for an older key's delay. While every batch thread is busy, tasks
// keep queueing, and a thread that comes back forms a batch at once from whatever is ready
// (adaptive batching: the busier the server, the larger the batches).
//
// Fairness between queues. A free batch thread looks at the queues round robin, starting after
// the queue that got the previous batch, and takes the first ready batch it finds. So a queue
// with a ready batch waits for at most one batch of every other queue, however busy they are: a
// hot model cannot starve a cold one.
//
// Task requirements (Task is the caller's type; queues own tasks through unique_ptr):
//   int64_t sequences() const;              // >= 1: counted against max_batch_sequences.
//   int64_t tokens() const;                 // >= 1: counted against max_batch_tokens.
//   int64_t bytes() const;                  // >= 0: memory it holds while queued, counted
//                                           // against the scheduler's max_queued_bytes.
//   const std::string& batch_key() const;   // Tasks with different keys never share a batch.
//   absl::Status CheckAdmissible(int64_t now_us) const;
//       // Non-OK (deadline passed, cancelled, ...) drops the task before compute with that
//       // status. `now_us` is the scheduler's Clock time.
// All five must return the same values for as long as the task is queued, except
// CheckAdmissible, which may turn non-OK at any time. They are called with the scheduler's lock
// held (CheckAdmissible on every queued task of a queue each time a batch of it is formed), so
// they must be cheap and must not call back into the scheduler or a queue.
//
// Thread-safety: everything may be called from any thread, except that BatchQueue::Drain, the
// queue's destructor and the scheduler's destructor must not run on a batch thread (i.e. from a
// callback). `process_batch` and `drop_task` run on the batch threads, never under the lock, so
// they may call Schedule or QueueSize; batches (of one queue or several) run concurrently on
// different threads. Every queue must be destroyed before its scheduler.
#ifndef ATTNSERVE_SERVER_BATCHING_SHARED_BATCH_SCHEDULER_H_
#define ATTNSERVE_SERVER_BATCHING_SHARED_BATCH_SCHEDULER_H_

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/batching/batching_options.h"
#include "server/batching/clock.h"

namespace attnserve::batching {

template <typename Task>
class SharedBatchScheduler;

// Tasks run together: all of one queue, all sharing one batch key. Timestamps travel with the
// batch so the executor can report each task's queue time (start_us - enqueue_us[i]).
template <typename Task>
struct Batch {
  std::vector<std::unique_ptr<Task>> tasks;  // In arrival order; never empty.
  std::vector<int64_t> enqueue_us;           // enqueue_us[i]: when tasks[i] was scheduled.
  int64_t start_us = 0;                      // When the batch was formed.
  int64_t sequences = 0;                     // Sum of tasks[i]->sequences().
  int64_t tokens = 0;                        // Sum of tasks[i]->tokens().
};

struct SharedBatchSchedulerOptions {
  // Threads that form and run batches, shared by every queue; each runs one batch at a time.
  // >= 1 (fewer is raised to 1).
  int num_batch_threads = 1;
  // The name of each batch thread as top and /proc show it (Linux keeps 15 characters).
  std::string thread_name = "attnserve-batch";
  // The most bytes (the sum of Task::bytes()) queued in all queues together; a task that would
  // pass it is refused with ResourceExhausted at once. 0 = no limit. Bounds the memory queued
  // requests hold whatever their count.
  int64_t max_queued_bytes = 0;
};

// One model's queue on a SharedBatchScheduler: its tasks, its options and its callbacks.
// Made by SharedBatchScheduler::AddQueue.
template <typename Task>
class BatchQueue {
 public:
  // Runs one batch; owns it.
  using ProcessBatchFn = std::function<void(Batch<Task> batch)>;
  // Receives a task that will not run, with the reason (its non-OK CheckAdmissible status).
  using DropTaskFn = std::function<void(std::unique_ptr<Task> task, absl::Status status)>;

  BatchQueue(const BatchQueue&) = delete;
  BatchQueue& operator=(const BatchQueue&) = delete;

  // Drains (see Drain): every task already scheduled is processed or dropped before this returns.
  ~BatchQueue() { Drain(); }

  // Queues *task. On OK the queue owns it and *task is null; on any error *task is untouched
  // and still the caller's. Never waits for processing.
  //   InvalidArgument: task or *task is null, sequences() or tokens() is below 1, or the task
  //       alone exceeds max_batch_sequences, max_batch_tokens, this queue's or the scheduler's
  //       max_queued_bytes (the message names the option, its value and the task's).
  //   ResourceExhausted: max_queue_size tasks are already queued (named, with its value), or the
  //       task's bytes would take this queue past its max_queued_bytes or all queues past the
  //       scheduler's max_queued_bytes (named, with the bytes queued and the task's), after any
  //       of this queue's tasks whose CheckAdmissible fails were removed (and handed to
  //       drop_task).
  //   Unavailable: Drain has begun.
  absl::Status Schedule(std::unique_ptr<Task>* task) {
    if (task == nullptr || *task == nullptr) {
      return absl::InvalidArgumentError("Schedule: expected a task, got null");
    }
    const Task& t = **task;
    const int64_t sequences = t.sequences();
    const int64_t tokens = t.tokens();
    if (sequences < 1 || tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("Schedule: a task needs >= 1 sequence and token, got ", sequences,
                       " sequences and ", tokens, " tokens"));
    }
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu());
      if (draining_) {
        return absl::UnavailableError("batch queue is draining and accepts no new tasks");
      }
      if (sequences > options_.max_batch_sequences) {
        return absl::InvalidArgumentError(
            absl::StrCat("task has ", sequences, " sequences, more than max_batch_sequences (",
                         options_.max_batch_sequences, ")"));
      }
      if (tokens > options_.max_batch_tokens) {
        return absl::InvalidArgumentError(absl::StrCat("task has ", tokens,
                                                       " tokens, more than max_batch_tokens (",
                                                       options_.max_batch_tokens, ")"));
      }
      // A task that can never fit is not a moment of overload: refused as too large, like one
      // past max_batch_tokens, so that nobody retries it.
      const int64_t bytes = t.bytes();
      if (options_.max_queued_bytes > 0 && bytes > options_.max_queued_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("task holds ", bytes, " bytes, more than this queue's max_queued_bytes (",
                         options_.max_queued_bytes, ")"));
      }
      if (scheduler_->max_queued_bytes_ > 0 && bytes > scheduler_->max_queued_bytes_) {
        return absl::InvalidArgumentError(
            absl::StrCat("task holds ", bytes, " bytes, more than the server's max_queued_bytes (",
                         scheduler_->max_queued_bytes_, ")"));
      }
      if (static_cast<int64_t>(queue_.size()) >= options_.max_queue_size) {
        // Tasks whose caller is gone (deadline, cancellation) must not keep live ones out: with
        // a long max_queue_delay_us they would otherwise wait for the next batch to be dropped.
        const size_t before = purged_.size();
        RemoveInadmissible(scheduler_->clock_->NowMicros(), &purged_);
        if (purged_.size() != before) wake = true;  // A batch thread hands them back.
      }
      if (static_cast<int64_t>(queue_.size()) >= options_.max_queue_size) {
        if (wake) scheduler_->cv_.notify_all();
        return absl::ResourceExhaustedError(absl::StrCat("batch queue is full: max_queue_size (",
                                                         options_.max_queue_size,
                                                         ") tasks are waiting"));
      }
      if (!BytesFitLocked(bytes) || !scheduler_->BytesFitLocked(bytes)) {
        const size_t before = purged_.size();
        RemoveInadmissible(scheduler_->clock_->NowMicros(), &purged_);
        if (purged_.size() != before) wake = true;
      }
      if (!BytesFitLocked(bytes)) {
        if (wake) scheduler_->cv_.notify_all();
        return absl::ResourceExhaustedError(absl::StrCat(
            "batch queue is at its memory limit: max_queued_bytes (", options_.max_queued_bytes,
            ") with ", queued_bytes_, " bytes queued, and this request holds ", bytes));
      }
      if (!scheduler_->BytesFitLocked(bytes)) {
        if (wake) scheduler_->cv_.notify_all();
        return absl::ResourceExhaustedError(
            absl::StrCat("queued requests are at the server's memory limit: max_queued_bytes (",
                         scheduler_->max_queued_bytes_, ") with ", scheduler_->queued_bytes_,
                         " bytes queued, and this request holds ", bytes));
      }
      queued_bytes_ += bytes;
      scheduler_->queued_bytes_ += bytes;
      // Batch threads wait for a deadline or a change that can release a batch; only wake them
      // for such a change, so a burst of small tasks does not rescan the queues once per task.
      const bool was_empty = queue_.empty();  // The threads' deadlines did not count this queue.
      KeyTotals& totals = queued_by_key_[t.batch_key()];
      totals.tasks += 1;
      totals.sequences += sequences;
      totals.tokens += tokens;
      wake = wake || was_empty || options_.max_queue_delay_us == 0 || IsFull(totals);
      queue_.push_back(Queued{std::move(*task), scheduler_->clock_->NowMicros()});
    }
    if (wake) scheduler_->cv_.notify_all();
    return absl::OkStatus();
  }

  // Replaces the limits, delay and queue size; they apply from the next batch formed (a batch
  // already formed is not changed; queued tasks larger than new limits run alone).
  // InvalidArgument (ValidateBatchingOptions) leaves the options unchanged.
  absl::Status UpdateOptions(const BatchingOptions& options) {
    if (absl::Status status = ValidateBatchingOptions(options); !status.ok()) return status;
    {
      std::lock_guard<std::mutex> lock(mu());
      options_ = options;
    }
    scheduler_->cv_.notify_all();  // A shorter delay or smaller limit may release a batch now.
    return absl::OkStatus();
  }

  // The options in force.
  BatchingOptions options() const {
    std::lock_guard<std::mutex> lock(mu());
    return options_;
  }

  // Tasks scheduled and not yet in a batch or dropped.
  int64_t QueueSize() const {
    std::lock_guard<std::mutex> lock(mu());
    return static_cast<int64_t>(queue_.size());
  }

  // Bytes (Task::bytes()) of the tasks QueueSize counts.
  int64_t QueuedBytes() const {
    std::lock_guard<std::mutex> lock(mu());
    return queued_bytes_;
  }

  // Stops accepting tasks (Schedule returns Unavailable from now on), has every queued task run
  // in batches without waiting for max_queue_delay_us (inadmissible ones go to drop_task), and
  // returns once all of them, and every batch of this queue already running, are done. The
  // queue then leaves the scheduler. Idempotent; concurrent calls all return once drained. Must
  // not be called from a callback.
  void Drain() {
    std::unique_lock<std::mutex> lock(mu());
    draining_ = true;
    scheduler_->cv_.notify_all();
    drained_.wait(lock, [this] { return IsDrainedLocked(); });
    scheduler_->RemoveQueueLocked(this);
  }

 private:
  friend class SharedBatchScheduler<Task>;

  struct Queued {
    std::unique_ptr<Task> task;
    int64_t enqueue_us;
  };

  // What is queued under one batch key: decides "full" without scanning the queue. The queued
  // tasks of a key fill a batch exactly when their totals reach a limit.
  struct KeyTotals {
    int64_t tasks = 0;
    int64_t sequences = 0;
    int64_t tokens = 0;
    uint64_t seen_in_scan = 0;  // FormBatch bookkeeping: the last scan that met this key.
  };

  struct DroppedTask {
    std::unique_ptr<Task> task;
    absl::Status status;
  };

  // What a batch thread takes from the queue at once: a batch, tasks to drop, or both.
  struct Work {
    Batch<Task> batch;                 // Empty: no batch.
    std::vector<DroppedTask> dropped;  // Inadmissible tasks, already out of the queue.
    bool empty() const { return batch.tasks.empty() && dropped.empty(); }
  };

  BatchQueue(SharedBatchScheduler<Task>* scheduler, const BatchingOptions& options,
             ProcessBatchFn process_batch, DropTaskFn drop_task)
      : scheduler_(scheduler),
        process_batch_(std::move(process_batch)),
        drop_task_(std::move(drop_task)),
        options_(options) {}

  std::mutex& mu() const ABSL_LOCK_RETURNED(scheduler_->mu_) { return scheduler_->mu_; }

  // a + b for b >= 0, saturating instead of overflowing (a huge delay means "never").
  static int64_t SaturatingAdd(int64_t a, int64_t b) {
    return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max()
                                                       : a + b;
  }

  bool IsFull(const KeyTotals& totals) const {
    return totals.sequences >= options_.max_batch_sequences ||
           totals.tokens >= options_.max_batch_tokens;
  }

  // Whether `bytes` more fit under options_.max_queued_bytes (0: no limit). As for the
  // scheduler's budget, a task larger than the whole limit never fits.
  bool BytesFitLocked(int64_t bytes) const {
    return options_.max_queued_bytes == 0 || queued_bytes_ + bytes <= options_.max_queued_bytes;
  }

  bool IsDrainedLocked() const {
    return draining_ && queue_.empty() && purged_.empty() && in_process_ == 0;
  }

  void Forget(const Task& task) {
    auto it = queued_by_key_.find(task.batch_key());
    KeyTotals& totals = it->second;
    totals.tasks -= 1;
    totals.sequences -= task.sequences();
    totals.tokens -= task.tokens();
    queued_bytes_ -= task.bytes();
    scheduler_->queued_bytes_ -= task.bytes();
    if (totals.tasks == 0) queued_by_key_.erase(it);
  }

  // Called by a batch thread with the scheduler's lock held: takes what is ready (tasks purged by
  // Schedule, else a ready batch and the tasks dropped while forming it) into *work. When
  // nothing is, lowers *wake_us to when something will be.
  void TakeWorkLocked(int64_t now_us, Work* work, int64_t* wake_us) {
    if (!purged_.empty()) {
      work->dropped = std::move(purged_);
      purged_.clear();
    } else if (!queue_.empty()) {
      FormBatch(now_us, work, wake_us);
    }
    if (!work->empty()) ++in_process_;
  }

  // Called by a batch thread once the work TakeWorkLocked gave it is done, with the lock held.
  void WorkDoneLocked() {
    --in_process_;
    if (IsDrainedLocked()) drained_.notify_all();
  }

  // Moves every queued task whose CheckAdmissible(now_us) is not OK to `dropped`.
  void RemoveInadmissible(int64_t now_us, std::vector<DroppedTask>* dropped) {
    size_t kept = 0;
    for (size_t i = 0; i < queue_.size(); ++i) {
      absl::Status status = queue_[i].task->CheckAdmissible(now_us);
      if (!status.ok()) {
        Forget(*queue_[i].task);
        dropped->push_back(DroppedTask{std::move(queue_[i].task), std::move(status)});
        continue;
      }
      if (kept != i) queue_[kept] = std::move(queue_[i]);
      ++kept;
    }
    queue_.resize(kept);
  }

  // Removes inadmissible tasks, then takes the first ready batch (in the order of each key's
  // oldest task) out of the queue. Three linear passes; queue_ holds at most max_queue_size.
  void FormBatch(int64_t now_us, Work* work, int64_t* wake_us) {
    // 1. Drop what may no longer run, so it neither fills nor delays a batch.
    RemoveInadmissible(now_us, &work->dropped);

    // 2. The first key (by oldest task) that is ready; otherwise when the earliest will be.
    const uint64_t scan = ++scan_count_;
    const std::string* ready_key = nullptr;
    for (const Queued& queued : queue_) {
      KeyTotals& totals = queued_by_key_.find(queued.task->batch_key())->second;
      if (totals.seen_in_scan == scan) continue;  // Not this key's oldest task.
      totals.seen_in_scan = scan;
      const int64_t release_us = SaturatingAdd(queued.enqueue_us, options_.max_queue_delay_us);
      if (draining_ || now_us >= release_us || IsFull(totals)) {
        ready_key = &queued.task->batch_key();
        break;
      }
      *wake_us = std::min(*wake_us, release_us);
    }
    if (ready_key == nullptr) return;

    // 3. Move that key's tasks that fit into the batch, first fit in arrival order. The oldest
    // always goes, even if UpdateOptions has since shrunk the limits below its size.
    Batch<Task>& batch = work->batch;
    batch.start_us = now_us;
    const std::string_view key = *ready_key;  // Owned by a task, which never moves.
    size_t kept = 0;
    for (size_t i = 0; i < queue_.size(); ++i) {
      Task& task = *queue_[i].task;
      const bool fits = batch.tasks.empty() ||
                        (batch.sequences + task.sequences() <= options_.max_batch_sequences &&
                         batch.tokens + task.tokens() <= options_.max_batch_tokens);
      if (fits && task.batch_key() == key) {
        batch.sequences += task.sequences();
        batch.tokens += task.tokens();
        Forget(task);
        batch.enqueue_us.push_back(queue_[i].enqueue_us);
        batch.tasks.push_back(std::move(queue_[i].task));
        continue;
      }
      if (kept != i) queue_[kept] = std::move(queue_[i]);
      ++kept;
    }
    queue_.resize(kept);
  }

  // Runs `work` (outside the lock): drops first, then the batch.
  void Perform(Work work) {
    for (DroppedTask& dropped : work.dropped) {
      drop_task_(std::move(dropped.task), std::move(dropped.status));
    }
    if (!work.batch.tasks.empty()) process_batch_(std::move(work.batch));
  }

  SharedBatchScheduler<Task>* const scheduler_;
  const ProcessBatchFn process_batch_;
  const DropTaskFn drop_task_;

  // All guarded by the scheduler's mutex, mu().
  BatchingOptions options_;
  std::deque<Queued> queue_;  // Arrival order.
  absl::flat_hash_map<std::string, KeyTotals> queued_by_key_;
  uint64_t scan_count_ = 0;
  int64_t queued_bytes_ = 0;  // Sum of bytes() of queue_'s tasks.
  // Inadmissible tasks Schedule removed from a full queue, for a batch thread to hand to
  // drop_task (callbacks never run on the caller's thread).
  std::vector<DroppedTask> purged_;
  int in_process_ = 0;  // Work taken by batch threads and not yet done.
  bool draining_ = false;
  std::condition_variable drained_;  // Signalled when IsDrainedLocked() becomes true.
};

template <typename Task>
class SharedBatchScheduler {
 public:
  // Starts options.num_batch_threads batch threads. `clock` is not owned and must outlive the
  // scheduler; it times queue delays and enqueue stamps.
  explicit SharedBatchScheduler(const SharedBatchSchedulerOptions& options,
                                Clock* clock = RealClock::Default())
      : clock_(clock),
        num_batch_threads_(std::max(1, options.num_batch_threads)),
        max_queued_bytes_(std::max<int64_t>(0, options.max_queued_bytes)) {
    threads_.reserve(num_batch_threads_);
    for (int i = 0; i < num_batch_threads_; ++i) {
      threads_.emplace_back([this] { Run(); });
      pthread_setname_np(threads_.back().native_handle(),
                         options.thread_name.substr(0, 15).c_str());
    }
  }

  // Stops the batch threads once every queue is gone. Queues must be destroyed first (each
  // drains itself); one still registered is drained here, so no task is lost either way.
  ~SharedBatchScheduler() {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
    while (!queues_.empty()) {
      BatchQueue<Task>* queue = queues_.front();
      queue->draining_ = true;
      cv_.notify_all();
      queue->drained_.wait(lock, [queue] { return queue->IsDrainedLocked(); });
      RemoveQueueLocked(queue);
    }
    lock.unlock();
    for (std::thread& thread : threads_) thread.join();
  }

  SharedBatchScheduler(const SharedBatchScheduler&) = delete;
  SharedBatchScheduler& operator=(const SharedBatchScheduler&) = delete;

  // A new queue served by this scheduler's threads. InvalidArgument (ValidateBatchingOptions)
  // for bad options. Both callbacks must be non-null. The queue must be destroyed before the
  // scheduler.
  absl::StatusOr<std::unique_ptr<BatchQueue<Task>>> AddQueue(
      const BatchingOptions& options, typename BatchQueue<Task>::ProcessBatchFn process_batch,
      typename BatchQueue<Task>::DropTaskFn drop_task) {
    if (absl::Status status = ValidateBatchingOptions(options); !status.ok()) return status;
    std::unique_ptr<BatchQueue<Task>> queue(
        new BatchQueue<Task>(this, options, std::move(process_batch), std::move(drop_task)));
    std::lock_guard<std::mutex> lock(mu_);
    queues_.push_back(queue.get());
    return queue;
  }

  int num_batch_threads() const { return num_batch_threads_; }
  int64_t max_queued_bytes() const { return max_queued_bytes_; }
  // Bytes (Task::bytes()) queued in all queues now.
  int64_t QueuedBytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_bytes_;
  }

 private:
  friend class BatchQueue<Task>;

  // Whether `bytes` more fit under max_queued_bytes. A task larger than the whole budget never
  // fits; one that fits alone is admitted into an empty scheduler.
  bool BytesFitLocked(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return max_queued_bytes_ == 0 || queued_bytes_ + bytes <= max_queued_bytes_;
  }

  void RemoveQueueLocked(BatchQueue<Task>* queue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = std::find(queues_.begin(), queues_.end(), queue);
    if (it == queues_.end()) return;  // Already removed (a second Drain).
    const size_t index = static_cast<size_t>(it - queues_.begin());
    queues_.erase(it);
    if (next_ > index) --next_;  // Keep pointing at the same queue.
  }

  // One batch thread: find the next queue with ready work (round robin), run it outside the
  // lock, repeat; exit once stopping and no queue is left.
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (stopping_ && queues_.empty()) return;
      const int64_t now_us = clock_->NowMicros();
      int64_t wake_us = kNoDeadline;
      typename BatchQueue<Task>::Work work;
      BatchQueue<Task>* owner = nullptr;
      const size_t count = queues_.size();
      for (size_t i = 0; i < count && owner == nullptr; ++i) {
        const size_t index = (next_ + i) % count;
        queues_[index]->TakeWorkLocked(now_us, &work, &wake_us);
        if (!work.empty()) {
          owner = queues_[index];
          next_ = (index + 1) % count;  // The next look starts after the queue served.
        }
      }
      if (owner == nullptr) {
        clock_->WaitUntil(cv_, lock, wake_us);
        continue;
      }
      // More may be ready, and a thread that last saw nothing may wait with no deadline.
      cv_.notify_all();
      lock.unlock();
      owner->Perform(std::move(work));
      lock.lock();
      owner->WorkDoneLocked();
    }
  }

  Clock* const clock_;
  const int num_batch_threads_;
  const int64_t max_queued_bytes_;
  std::vector<std::thread> threads_;

  // Guards every queue's state as well as the scheduler's. A std pair (not absl::Mutex) so that
  // Clock::WaitUntil can wait on it and ThreadSanitizer sees it.
  mutable std::mutex mu_;
  // Signalled when a batch may have become ready, or a queue began draining.
  std::condition_variable cv_;
  std::vector<BatchQueue<Task>*> queues_ ABSL_GUARDED_BY(mu_);  // In the order they were added.
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;           // Where the next round-robin look starts.
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Sum of bytes() of every queued task.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_SHARED_BATCH_SCHEDULER_H_
