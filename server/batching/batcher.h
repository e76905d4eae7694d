// Batcher<Task>: a model-agnostic dynamic batcher, after TF Serving's BasicBatchScheduler.
//
// Callers Schedule tasks; batch threads group queued tasks into batches and hand each batch to
// `process_batch`. The batcher knows nothing of what a task computes: it only reads a task's
// size, its batch key and whether it may still run.
//
// Batch formation. Tasks queue in arrival order (FIFO). A batch is formed for one batch key: it
// takes the oldest queued task of that key, then later tasks of the same key that still fit
// both max_batch_sequences and max_batch_tokens. A task that does not fit is skipped and keeps
// its place in the queue (it will be the oldest of a later batch, so it cannot starve); tasks of
// other keys are never mixed in. A key's batch is released when
//   - it is full: its queued tasks reach a limit (so the next one would not fit), or
//   - its oldest task has waited max_queue_delay_us, or
//   - the batcher is draining.
// Keys are considered in the order of their oldest task, so a full batch of a younger key does
// not wait for an older key's delay. While every batch thread is busy, tasks keep queueing, and a
// thread that comes back forms a batch at once from whatever is ready (adaptive batching: the
// busier the server, the larger the batches).
//
// Task requirements (Task is the caller's type; the batcher owns tasks through unique_ptr):
//   int64_t sequences() const;              // >= 1: counted against max_batch_sequences.
//   int64_t tokens() const;                 // >= 1: counted against max_batch_tokens.
//   const std::string& batch_key() const;   // Tasks with different keys never share a batch.
//   absl::Status CheckAdmissible(int64_t now_us) const;
//       // Non-OK (deadline passed, cancelled, ...) drops the task before compute with that
//       // status. `now_us` is the batcher's Clock time.
// All four must return the same values for as long as the task is queued, except
// CheckAdmissible, which may turn non-OK at any time. They are called with the batcher's lock
// held (CheckAdmissible on every queued task each time a batch is formed), so they must be cheap
// and must not call back into the batcher.
//
// Thread-safety: Schedule, UpdateOptions, options and QueueSize may be called from any thread at
// any time. Drain and the destructor must not run on a batch thread (i.e. from a callback).
// `process_batch` and `drop_task` run on the batch threads, never under the batcher's lock, so
// they may call Schedule or QueueSize; with num_batch_threads > 1 they run concurrently.
#ifndef ATTNSERVE_SERVER_BATCHING_BATCHER_H_
#define ATTNSERVE_SERVER_BATCHING_BATCHER_H_

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
class Batcher {
 public:
  // Tasks run together: all share one batch key. Timestamps travel with the batch so the
  // executor can report each task's queue time (start_us - enqueue_us[i]).
  struct Batch {
    std::vector<std::unique_ptr<Task>> tasks;  // In arrival order; never empty.
    std::vector<int64_t> enqueue_us;           // enqueue_us[i]: when tasks[i] was scheduled.
    int64_t start_us = 0;                      // When the batch was formed.
    int64_t sequences = 0;                     // Sum of tasks[i]->sequences().
    int64_t tokens = 0;                        // Sum of tasks[i]->tokens().
  };

  // Runs one batch; owns it.
  using ProcessBatchFn = std::function<void(Batch batch)>;
  // Receives a task that will not run, with the reason (its non-OK CheckAdmissible status).
  using DropTaskFn = std::function<void(std::unique_ptr<Task> task, absl::Status status)>;

  // Like the constructor, but InvalidArgument (ValidateBatchingOptions) for bad options instead
  // of adjusting them.
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(const BatchingOptions& options,
                                                         ProcessBatchFn process_batch,
                                                         DropTaskFn drop_task,
                                                         Clock* clock = RealClock::Default()) {
    if (absl::Status status = ValidateBatchingOptions(options); !status.ok()) return status;
    return std::make_unique<Batcher>(options, std::move(process_batch), std::move(drop_task),
                                     clock);
  }

  // Starts options.num_batch_threads batch threads. Both callbacks must be non-null; `clock`
  // is not owned and must outlive the batcher. Options should pass ValidateBatchingOptions: a
  // constructor cannot report failure, so out-of-range fields are raised to their minimum
  // (use Create to be told instead).
  Batcher(const BatchingOptions& options, ProcessBatchFn process_batch, DropTaskFn drop_task,
          Clock* clock = RealClock::Default())
      : process_batch_(std::move(process_batch)),
        drop_task_(std::move(drop_task)),
        clock_(clock),
        options_(Clamped(options)) {
    threads_.reserve(options_.num_batch_threads);
    for (int i = 0; i < options_.num_batch_threads; ++i) {
      threads_.emplace_back([this] { Run(); });
    }
  }

  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Drains (see Drain): every task already scheduled is processed or dropped before this returns.
  ~Batcher() { Drain(); }

  // Queues *task. On OK the batcher owns it and *task is null; on any error *task is untouched
  // and still the caller's. Never waits for processing.
  //   InvalidArgument: task or *task is null, sequences() or tokens() is below 1, or the task
  //       alone exceeds max_batch_sequences or max_batch_tokens (the message names the option,
  //       its value and the task's).
  //   ResourceExhausted: max_queue_size tasks are already queued (named, with its value), after
  //       any whose CheckAdmissible fails were removed (and handed to drop_task).
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
      std::lock_guard<std::mutex> lock(mu_);
      if (draining_) {
        return absl::UnavailableError("batcher is shutting down and accepts no new tasks");
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
      if (static_cast<int64_t>(queue_.size()) >= options_.max_queue_size) {
        // Tasks whose caller is gone (deadline, cancellation) must not keep live ones out: with
        // a long max_queue_delay_us they would otherwise wait for the next batch to be dropped.
        const size_t before = purged_.size();
        RemoveInadmissible(clock_->NowMicros(), &purged_);
        if (purged_.size() != before) cv_.notify_all();  // A batch thread hands them back.
      }
      if (static_cast<int64_t>(queue_.size()) >= options_.max_queue_size) {
        return absl::ResourceExhaustedError(absl::StrCat("batch queue is full: max_queue_size (",
                                                         options_.max_queue_size,
                                                         ") tasks are waiting"));
      }
      // Batch threads wait for a deadline or a change that can release a batch; only wake them
      // for such a change, so a burst of small tasks does not rescan the queue once per task.
      const bool was_empty = queue_.empty();  // Idle threads wait with no deadline.
      KeyTotals& totals = queued_by_key_[t.batch_key()];
      totals.tasks += 1;
      totals.sequences += sequences;
      totals.tokens += tokens;
      wake = was_empty || options_.max_queue_delay_us == 0 || IsFull(totals);
      queue_.push_back(Queued{std::move(*task), clock_->NowMicros()});
    }
    if (wake) cv_.notify_all();
    return absl::OkStatus();
  }

  // Replaces the limits, delay and queue size; they apply from the next batch formed (a batch
  // already formed is not changed; queued tasks larger than new limits run alone).
  // num_batch_threads is fixed at construction and ignored here. InvalidArgument
  // (ValidateBatchingOptions) leaves the options unchanged.
  absl::Status UpdateOptions(const BatchingOptions& options) {
    if (absl::Status status = ValidateBatchingOptions(options); !status.ok()) return status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int threads = options_.num_batch_threads;
      options_ = options;
      options_.num_batch_threads = threads;
    }
    cv_.notify_all();  // A shorter delay or smaller limit may release a batch now.
    return absl::OkStatus();
  }

  // The options in force (num_batch_threads: the threads actually started).
  BatchingOptions options() const {
    std::lock_guard<std::mutex> lock(mu_);
    return options_;
  }

  // Tasks scheduled and not yet in a batch or dropped.
  int64_t QueueSize() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(queue_.size());
  }

  // Stops accepting tasks (Schedule returns Unavailable from now on), then runs every queued
  // task in batches without waiting for max_queue_delay_us (inadmissible ones go to drop_task),
  // and joins the batch threads. Returns when all of that is done. Idempotent; concurrent calls
  // all return once the batcher has drained. Must not be called from a callback.
  void Drain() {
    std::lock_guard<std::mutex> drain_lock(drain_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      draining_ = true;
    }
    cv_.notify_all();
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }

 private:
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

  // The outcome of one look at the queue.
  struct Formed {
    Batch batch;                       // Empty: nothing is ready.
    std::vector<DroppedTask> dropped;  // Inadmissible tasks, already out of the queue.
    int64_t wake_us = kNoDeadline;     // When to look again if nothing was ready.
  };

  static BatchingOptions Clamped(BatchingOptions options) {
    options.max_batch_sequences = std::max<int64_t>(1, options.max_batch_sequences);
    options.max_batch_tokens = std::max<int64_t>(1, options.max_batch_tokens);
    options.max_queue_delay_us = std::max<int64_t>(0, options.max_queue_delay_us);
    options.max_queue_size = std::max<int64_t>(1, options.max_queue_size);
    options.num_batch_threads = std::max(1, options.num_batch_threads);
    return options;
  }

  // a + b for b >= 0, saturating instead of overflowing (a huge delay means "never").
  static int64_t SaturatingAdd(int64_t a, int64_t b) {
    return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max()
                                                       : a + b;
  }

  bool IsFull(const KeyTotals& totals) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return totals.sequences >= options_.max_batch_sequences ||
           totals.tokens >= options_.max_batch_tokens;
  }

  void Forget(const Task& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = queued_by_key_.find(task.batch_key());
    KeyTotals& totals = it->second;
    totals.tasks -= 1;
    totals.sequences -= task.sequences();
    totals.tokens -= task.tokens();
    if (totals.tasks == 0) queued_by_key_.erase(it);
  }

  // One batch thread: form a batch when one is ready, run it outside the lock, repeat; exit
  // once draining and nothing is queued.
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (!purged_.empty()) {  // Removed by Schedule to make room: answer them here.
        std::vector<DroppedTask> purged = std::move(purged_);
        purged_.clear();
        lock.unlock();
        for (DroppedTask& dropped : purged) {
          drop_task_(std::move(dropped.task), std::move(dropped.status));
        }
        lock.lock();
        continue;
      }
      if (queue_.empty()) {
        if (draining_) return;
        clock_->WaitUntil(cv_, lock, kNoDeadline);
        continue;
      }
      Formed formed = FormBatch(clock_->NowMicros());
      if (formed.batch.tasks.empty() && formed.dropped.empty()) {
        clock_->WaitUntil(cv_, lock, formed.wake_us);
        continue;
      }
      // Another key may be ready too, and a thread that last saw an empty queue is waiting with
      // no deadline: let it look.
      if (!queue_.empty()) cv_.notify_all();
      lock.unlock();
      for (DroppedTask& dropped : formed.dropped) {
        drop_task_(std::move(dropped.task), std::move(dropped.status));
      }
      if (!formed.batch.tasks.empty()) process_batch_(std::move(formed.batch));
      lock.lock();
    }
  }

  // Moves every queued task whose CheckAdmissible(now_us) is not OK to `dropped`.
  void RemoveInadmissible(int64_t now_us, std::vector<DroppedTask>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
  Formed FormBatch(int64_t now_us) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Formed formed;
    // 1. Drop what may no longer run, so it neither fills nor delays a batch.
    RemoveInadmissible(now_us, &formed.dropped);

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
      formed.wake_us = std::min(formed.wake_us, release_us);
    }
    if (ready_key == nullptr) return formed;

    // 3. Move that key's tasks that fit into the batch, first fit in arrival order. The oldest
    // always goes, even if UpdateOptions has since shrunk the limits below its size.
    Batch& batch = formed.batch;
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
    return formed;
  }

  const ProcessBatchFn process_batch_;
  const DropTaskFn drop_task_;
  Clock* const clock_;

  std::mutex drain_mu_;  // Serialises Drain; guards threads_ after construction.
  std::vector<std::thread> threads_;

  mutable std::mutex mu_;
  // Signalled when a batch may have become ready or draining began. A std pair (not
  // absl::Mutex) so that Clock::WaitUntil can wait on it.
  std::condition_variable cv_;
  BatchingOptions options_ ABSL_GUARDED_BY(mu_);
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);  // Arrival order.
  absl::flat_hash_map<std::string, KeyTotals> queued_by_key_ ABSL_GUARDED_BY(mu_);
  uint64_t scan_count_ ABSL_GUARDED_BY(mu_) = 0;
  // Inadmissible tasks Schedule removed from a full queue, for a batch thread to hand to
  // drop_task (callbacks never run on the caller's thread).
  std::vector<DroppedTask> purged_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_BATCHER_H_
