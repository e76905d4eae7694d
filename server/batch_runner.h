// BatchRunner: executes one batch of AttendTasks as a single ragged forward pass and answers
// every task in it.
//
// The batcher forms batches; this component runs them (Triton's scheduler/executor split). All
// tasks of a batch share a batch key (attend_task.h), so they need the same forward pass: their
// sequences are packed into one ragged batch, run once, and the output rows handed back per task.
// When a multi-task batch fails (e.g. one request's values overflow fp32), each task is run again
// alone so that only the culprit gets the error.
//
// Thread-safe: Run() may be called from any number of batcher threads; each thread gets its own
// core::AttentionExecutor, and at most `max_concurrent_batches` forward passes run at once so the
// compute threads never oversubscribe the cores.
#ifndef ATTNSERVE_SERVER_BATCH_RUNNER_H_
#define ATTNSERVE_SERVER_BATCH_RUNNER_H_

#include <cstdint>
#include <memory>
#include <semaphore>
#include <vector>

#include "core/attention_executor.h"
#include "server/attend_task.h"
#include "server/batching/batcher.h"
#include "server/batching/clock.h"

namespace attnserve::server {

struct BatchRunnerOptions {
  // Per forward pass (core::ExecutorOptions::compute_threads); 0 = OMP_NUM_THREADS or one per
  // core.
  int compute_threads = 0;
  // Forward passes that may run at the same moment, across all models. Default 1: one batch uses
  // every compute thread, and a second would only fight it for the same cores.
  int max_concurrent_batches = 1;
};

class BatchRunner {
 public:
  using Batch = batching::Batcher<AttendTask>::Batch;

  // `clock` (not owned, outlives the runner) times the compute; it must be the batchers' clock,
  // whose enqueue times the queue time is measured from.
  explicit BatchRunner(const BatchRunnerOptions& options,
                       batching::Clock* clock = batching::RealClock::Default());
  BatchRunner(const BatchRunner&) = delete;
  BatchRunner& operator=(const BatchRunner&) = delete;

  // Computes `batch` and finishes each of its tasks with its result or the error.
  void Run(Batch batch);

  const BatchRunnerOptions& options() const { return options_; }

 private:
  // Runs `tasks` (enqueued at `enqueue_us`) as one forward pass. On success finishes every task
  // and returns OK; on failure finishes none and returns the error.
  absl::Status RunTogether(const std::vector<AttendTask*>& tasks,
                           const std::vector<int64_t>& enqueue_us);
  core::AttentionExecutor& ThreadExecutor();

  const BatchRunnerOptions options_;
  batching::Clock* const clock_;
  std::counting_semaphore<> compute_slots_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCH_RUNNER_H_
