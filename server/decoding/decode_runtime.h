// DecodeRuntime: decoding sessions with continuous batching — the server runtime below any wire API
// (attnserve.v1 Decode sits on it). No protobuf, gRPC or Prometheus: the layer above converts
// messages into SessionSpec/StepRequest and reads DecodeStats or a DecodeListener for metrics.
//
// A session keeps K/V of its rows in the paged KV cache of its model version, so a client that
// generates token by token sends only each new row. One loop thread forms iterations from the
// waiting steps of all sessions (IterationScheduler: every waiting one-row step, plus prefill
// cut into chunks under a token budget, round robin between sessions) and runs each with one
// forward pass per model version and kind (IterationRunner). Sessions keep the model version
// they were opened with (a shared_ptr) across reloads.
//
// Life of a session: Open -> (ready callback) -> Append ... -> closed by Close (reason client),
// CloseOwner (owner_gone), idle_timeout_us without a step (idle) or Drain (drained). A closed
// session's queued steps are answered CANCELLED (UNAVAILABLE when drained), steps already in a
// running iteration are answered normally, and its blocks return to the budget right after.
// A step that cannot get blocks fails RESOURCE_EXHAUSTED, giving the budget and what is used;
// the session stays open and unchanged (a step is all or nothing), and the other sessions go on.
//
// Thread-safety: every public method may be called from any thread, including from callbacks
// (which run on the loop thread), except Drain and the destructor, which must not be called from
// a callback. No public method blocks on compute, except Drain.
#ifndef ATTNSERVE_SERVER_DECODING_DECODE_RUNTIME_H_
#define ATTNSERVE_SERVER_DECODING_DECODE_RUNTIME_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/batching/clock.h"
#include "server/decoding/decode_types.h"
#include "server/decoding/iteration_runner.h"
#include "server/decoding/kv_budget.h"
#include "server/decoding/session.h"

namespace attnserve::decoding {

class DecodeRuntime {
 public:
  // Starts the loop thread. InvalidArgument for bad options (ValidateDecodeRuntimeOptions).
  // `clock` (times idle sessions and step latency), `listener` and `teams` (each may be null)
  // are not owned and must outlive the runtime. With `teams`, every forward pass takes its
  // threads from it (the server's compute budget); without, it runs on
  // options.compute_threads of its own.
  static absl::StatusOr<std::unique_ptr<DecodeRuntime>> Create(
      const DecodeRuntimeOptions& options, batching::Clock* clock = batching::RealClock::Default(),
      DecodeListener* listener = nullptr, ComputeTeams* teams = nullptr);
  // Drains (see Drain).
  ~DecodeRuntime();
  DecodeRuntime(const DecodeRuntime&) = delete;
  DecodeRuntime& operator=(const DecodeRuntime&) = delete;

  // Opens a session. On OK the session exists at once (steps may be appended; they run after its
  // cache is attached and its memory loaded) and `ready` is called once when it is ready or has
  // failed (then the session is gone and its queued steps fail with the same status; e.g.
  // RESOURCE_EXHAUSTED when the memory does not fit the budget). Errors, `ready` not called:
  // InvalidArgument (no model; memory not [rows, d_model] or not finite, naming the field and
  // the expected value), ResourceExhausted (max_sessions open), Unavailable (draining).
  absl::StatusOr<SessionId> Open(SessionSpec spec, ReadyCallback ready);

  // Queues a step. On OK the runtime owns *request (moved from) and calls request->done exactly
  // once. On error nothing is kept and done is not called: NotFound (unknown or closed session,
  // naming it), InvalidArgument (rows empty, not a multiple of d_model, or not finite, naming
  // the field and expected value; done null), FailedPrecondition (model / model_version differ
  // from the session's, giving the session's), ResourceExhausted (the session already has
  // max_queued_rows_per_session rows queued), Unavailable (draining).
  absl::Status Append(StepRequest* request);

  // Append for each request in order, under one lock and with one wake-up of the loop, so that
  // steps sent together (one client message for many sessions) run in the same iteration instead
  // of being split by a loop that woke after the first. statuses[i] is Append's answer for
  // requests[i] (each OK one owned by the runtime, each failed one left untouched).
  std::vector<absl::Status> AppendAll(std::span<StepRequest* const> requests);

  // Closes a session (reason client). NotFound for an unknown or already closed one.
  absl::Status Close(SessionId id);
  // Closes every session of `owner` (reason owner_gone); returns how many.
  int64_t CloseOwner(OwnerKey owner);

  // Stops accepting (Open/Append: Unavailable), answers every accepted step, then closes every
  // session (reason drained), frees all blocks and stops the loop. Returns when done.
  // Idempotent. Must not be called from a callback.
  void Drain();

  // While paused no iteration runs (steps queue; opens, closes and idle timeouts still go on).
  // For tests that need several sessions' work in one iteration, and for maintenance.
  void Pause();
  void Resume();

  DecodeStats Stats() const;
  // Open sessions per model (name, version): what ModelInfo reports a version still holds.
  std::map<std::pair<std::string, int64_t>, int64_t> SessionsPerVersion() const;
  const DecodeRuntimeOptions& options() const { return options_; }

 private:
  DecodeRuntime(const DecodeRuntimeOptions& options, batching::Clock* clock,
                DecodeListener* listener, ComputeTeams* teams);
  void Loop();
  // Append's checks that need no lock.
  static absl::Status CheckStep(const StepRequest* request);
  // Append's checks against the session, then queues the step (without waking the loop).
  absl::Status QueueLocked(StepRequest* request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (up to options_.gather_delay_us) while fewer steps wait than expected_steps_.
  void GatherLocked(std::unique_lock<std::mutex>& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the loop has something to do now.
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the next session turns idle (kNoDeadline: none).
  int64_t NextIdleDeadlineLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `session` from the open ones and queues its close; its queued steps go to *dropped.
  void CloseLocked(const std::shared_ptr<Session>& session, CloseReason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the loop that it has work or a state change: cv_, and wake_ for an idle-time prefault.
  void WakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Closing {
    std::shared_ptr<Session> session;
    CloseReason reason;
    std::vector<std::unique_ptr<StepItem>> dropped;  // Its queued steps, to answer.
  };

  const DecodeRuntimeOptions options_;
  batching::Clock* const clock_;
  DecodeListener* const listener_;
  KvBudget budget_;         // Loop thread (and its atomic readers).
  IterationRunner runner_;  // Loop thread.

  mutable std::mutex mu_;
  std::condition_variable cv_;  // Work arrived, or a state change for the loop.
  // Set (under mu_) with every notification of cv_, cleared by the loop before an idle-time
  // prefault slice, which stops at the next page once it is set: work that arrives meanwhile
  // waits for one page fault, not for the slice.
  std::atomic<bool> wake_{false};
  std::condition_variable stopped_cv_;
  absl::flat_hash_map<SessionId, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Session>> to_load_ ABSL_GUARDED_BY(mu_);
  std::vector<Closing> to_close_ ABSL_GUARDED_BY(mu_);
  StepScheduler scheduler_ ABSL_GUARDED_BY(mu_);
  SessionId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  int64_t steps_queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Open sessions the last two iterations answered: the steps the gather delay waits for.
  int64_t expected_steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<SessionId> answered_last_ ABSL_GUARDED_BY(mu_);  // By the last iteration.
  DecodeStats totals_ ABSL_GUARDED_BY(mu_);                    // The counters of Stats().
  std::thread thread_;
  std::once_flag joined_;
};

}  // namespace attnserve::decoding

#endif  // ATTNSERVE_SERVER_DECODING_DECODE_RUNTIME_H_
