// BatchRunner: executes one batch of AttendTasks as a single ragged forward pass and answers
// every task in it.
//
// The shared batch scheduler forms batches; this component runs them (Triton's scheduler/executor
// split). All tasks of a batch share a batch key (attend_task.h), so they need the same forward
// pass: their sequences are packed into one ragged batch, run once, and the output rows handed back
// per task. When a multi-task batch fails (e.g. one request's values overflow fp32), each task is
// run again alone so that only the culprit gets the error.
//
// Thread-safe: Run() may be called from any number of batch threads. The compute threads are
// one ComputeBudget shared by every batch: a batch runs on as many as are free, up to all of them
// (one when its work is too small to gain from a second), so concurrent batches never
// oversubscribe the cores. Each batch thread keeps one core::AttentionExecutor per team size.
#ifndef ATTNSERVE_SERVER_RUNTIME_BATCH_RUNNER_H_
#define ATTNSERVE_SERVER_RUNTIME_BATCH_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/forward/attention_executor.h"
#include "server/batching/clock.h"
#include "server/batching/shared_batch_scheduler.h"
#include "server/runtime/attend_task.h"
#include "server/runtime/compute_budget.h"

namespace attnserve::server {

struct BatchRunnerOptions {
  // Compute threads of the whole server, shared by all batches of all models; also the largest
  // team one batch uses. 0 = AvailableCores() (compute_budget.h).
  int compute_threads = 0;
  // Batches with less estimated work (MFLOP: projections plus attention) run on one thread: waking
  // a second thread costs more than it saves. The default sits between a 16-row and a 32-row
  // sequence of d_model 512 (docs/PERFORMANCE.md, "Team width", has the measurements).
  int64_t parallel_min_mflop = 48;
};

// What one executed forward pass reports, for metrics. A batch that fails and is retried one
// request at a time reports each pass; the retries report no queue times (each request's was
// reported with the first pass).
struct BatchReport {
  const std::string& model;
  int64_t sequences = 0;
  int64_t tokens = 0;  // Query rows.
  int64_t compute_us = 0;
  std::span<const int64_t> queue_us;  // Per request: enqueue to the start of this pass.
};

class BatchRunner {
 public:
  using Batch = batching::Batch<AttendTask>;
  // Called on the batch thread after each forward pass, before its requests are answered.
  using BatchListener = std::function<void(const BatchReport& report)>;

  // `clock` (not owned, outlives the runner) times the compute; it must be the batch scheduler's
  // clock, whose enqueue times the queue time is measured from. `listener` may be empty.
  explicit BatchRunner(const BatchRunnerOptions& options,
                       batching::Clock* clock = batching::RealClock::Default(),
                       BatchListener listener = nullptr);
  BatchRunner(const BatchRunner&) = delete;
  BatchRunner& operator=(const BatchRunner&) = delete;

  // Computes `batch` and finishes each of its tasks with its result or the error.
  void Run(Batch batch);

  const BatchRunnerOptions& options() const { return options_; }
  // The compute threads shared by all batches (options.compute_threads resolved).
  int compute_threads() const { return budget_.threads(); }
  // The compute budget itself, for other compute of the server to share (the decoding loop's
  // passes), so that together they never run more threads than it has.
  ComputeBudget& compute_budget() { return budget_; }

 private:
  // Runs `tasks` (enqueued at `enqueue_us`) as one forward pass. On success finishes every task
  // and returns OK; on failure finishes none and returns the error. `retry`: the tasks already
  // ran in a failed pass (their queue time was reported then).
  absl::Status RunTogether(const std::vector<AttendTask*>& tasks,
                           const std::vector<int64_t>& enqueue_us, bool retry);
  // The calling thread's executor for teams of `threads` threads.
  core::AttentionExecutor& ThreadExecutor(int threads);

  const BatchRunnerOptions options_;
  batching::Clock* const clock_;
  const BatchListener listener_;
  ComputeBudget budget_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_BATCH_RUNNER_H_
