// BatchingOptions: how one BatchQueue (shared_batch_scheduler.h) groups its tasks into batches,
// and how much it queues. The batch threads belong to the scheduler, not to a queue.
//
// A plain value type; copy freely. Thread-safe as any const value.
#ifndef ATTNSERVE_SERVER_BATCHING_BATCHING_OPTIONS_H_
#define ATTNSERVE_SERVER_BATCHING_BATCHING_OPTIONS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace attnserve::batching {

struct BatchingOptions {
  // The most sequences in one batch (the sum of Task::sequences()). >= 1. A task with more is
  // refused by Schedule.
  int64_t max_batch_sequences = 64;
  // The most tokens in one batch (the sum of Task::tokens()). >= 1. A task with more is refused
  // by Schedule. 8192 rows of d_model=512 floats is 16 MiB of input per batch.
  int64_t max_batch_tokens = 8192;
  // The longest the oldest task of a batch waits for a fuller batch, in microseconds. >= 0;
  // 0 runs every batch as soon as a thread is free, and tasks still batch while the threads are
  // busy: under load, batches grow by themselves with no wait added. The default is 0, as in
  // TF Serving (batch_timeout_micros) and Triton (max_queue_delay_microseconds): on a CPU whose
  // throughput gains little from a bigger batch, waiting only adds latency. Raise it when
  // requests arrive in bursts and a fuller batch is worth the wait.
  int64_t max_queue_delay_us = 0;
  // The most tasks (not sequences) waiting to join a batch. >= 1. Schedule refuses more with
  // ResourceExhausted at once rather than let latency grow without bound.
  int64_t max_queue_size = 1024;
  // The most bytes (the sum of Task::bytes(): for a request, its inputs) waiting in this queue.
  // >= 0; 0 = no limit but the scheduler's. Schedule refuses more with ResourceExhausted at once.
  // Lower than the server-wide budget (SharedBatchSchedulerOptions::max_queued_bytes) so one
  // model under a flood of large requests cannot take all of it from the others.
  int64_t max_queued_bytes = int64_t{256} << 20;
};

// OK, or InvalidArgument naming the first bad field, what it expects and what it got.
absl::Status ValidateBatchingOptions(const BatchingOptions& options);

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_BATCHING_OPTIONS_H_
