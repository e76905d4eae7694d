// AttendTask: one validated Attend call waiting in a model's batch queue, and how to answer it.
//
// It satisfies the batcher's Task requirements (batching/shared_batch_scheduler.h): size in
// sequences and tokens, a batch key that keeps incompatible requests apart, and an admission check
// that drops requests whose deadline passed or whose caller cancelled. The answer is delivered
// exactly once through the done callback: by the batch runner, by the batch queue when it drops the
// task, or, as a last resort, by the destructor (Internal), so no accepted request is ever left
// unanswered.
//
// Not thread-safe; owned by one thread at a time (the RPC handler, then the batch queue).
#ifndef ATTNSERVE_SERVER_RUNTIME_ATTEND_TASK_H_
#define ATTNSERVE_SERVER_RUNTIME_ATTEND_TASK_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/runtime/attend_work.h"

namespace attnserve::server {

class AttendTask {
 public:
  // Receives the request and its result or error; called exactly once, on whichever thread
  // finishes the task.
  using DoneCallback =
      std::function<void(const AttendWork& work, absl::StatusOr<AttendResult> result)>;
  // Whether the caller has gone away (gRPC's ServerContext::IsCancelled); may be empty.
  using CancelledCheck = std::function<bool()>;

  // `deadline_us` is on the batch scheduler clock's time line (INT64_MAX = none).
  AttendTask(AttendWork work, int64_t deadline_us, CancelledCheck cancelled, DoneCallback done);
  // Answers Internal if nobody answered yet (a bug elsewhere, but the caller still hears back).
  ~AttendTask();
  AttendTask(const AttendTask&) = delete;
  AttendTask& operator=(const AttendTask&) = delete;

  // --- Task requirements of batching::BatchQueue ---
  int64_t sequences() const { return work_.sequences(); }
  int64_t tokens() const { return work_.tokens(); }
  int64_t bytes() const { return work_.bytes(); }
  // Requests share a batch only when they need the same forward pass: same model version,
  // self/cross attention, causal flag, explicit mask or not, weights or not, and head mask.
  const std::string& batch_key() const { return batch_key_; }
  // DeadlineExceeded once now_us passes the deadline; Cancelled once the caller cancelled.
  absl::Status CheckAdmissible(int64_t now_us) const;

  const AttendWork& work() const { return work_; }
  // Delivers the answer (only the first call has an effect).
  void Finish(absl::StatusOr<AttendResult> result);
  // Forgets the done callback without calling it: for a task the batch queue refused, whose caller
  // answers the RPC itself.
  void Release() { done_ = nullptr; }

 private:
  AttendWork work_;
  int64_t deadline_us_;
  CancelledCheck cancelled_;
  DoneCallback done_;
  std::string batch_key_;
};

// The batch key of `work` (see AttendTask::batch_key).
std::string BatchKeyOf(const AttendWork& work);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_ATTEND_TASK_H_
