// The plain types of the decoding runtime (decode_runtime.h): session and owner ids, what opens a
// session and what one step carries, close reasons, options, statistics and the listener through
// which the layer above (metrics) observes it. No protobuf, gRPC or Prometheus here.
#ifndef ATTNSERVE_SERVER_DECODING_DECODE_TYPES_H_
#define ATTNSERVE_SERVER_DECODING_DECODE_TYPES_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/model.h"
#include "server/batching/iteration_scheduler.h"
#include "server/decoding/kv_budget.h"

namespace attnserve::decoding {

// Names one session for its whole life; never 0, never reused by one runtime.
using SessionId = uint64_t;
// Who holds a session (e.g. one client stream): CloseOwner(owner) frees everything it held.
using OwnerKey = uint64_t;

// Why a session ended. Every close is counted under exactly one reason.
enum class CloseReason : int {
  kClient = 0,     // Close() was called.
  kIdle = 1,       // No step for idle_timeout_us.
  kEvicted = 2,    // Reserved: no eviction policy yet (the count stays 0).
  kDrained = 3,    // The runtime drained (shutdown).
  kOwnerGone = 4,  // CloseOwner(): its client went away.
};
inline constexpr int kNumCloseReasons = 5;
// "client", "idle", "evicted", "drained", "owner_gone".
std::string_view CloseReasonName(CloseReason reason);

// Receives a step's output rows ([rows, d_model], row-major) or why it failed. Called exactly
// once, on the runtime's loop thread; must not block (it may call the runtime).
using StepCallback = std::function<void(absl::StatusOr<std::vector<float>> output)>;
// Receives whether an opened session is ready (its cache attached, cross-attention memory
// loaded). Called exactly once, on the loop thread; must not block.
using ReadyCallback = std::function<void(absl::Status status)>;

struct SessionSpec {
  // The model version the session computes with for its whole life (its cache is valid only for
  // it), even after a reload serves another version under the same name. Required.
  std::shared_ptr<const model::Model> model = nullptr;
  // Who holds the session (see CloseOwner).
  OwnerKey owner = 0;
  // Empty: self-attention (causal over the session's own rows). Otherwise cross-attention: the
  // encoder memory, [rows, d_model] row-major finite floats, loaded into the cache once; steps
  // then attend over it (non-causal) and do not grow the cache.
  std::vector<float> memory = {};
  // Called once, on the loop thread, when the session closes (any CloseReason), after its queued
  // steps were answered; not when the open fails (`ready` hears of that). Must not block. May be
  // null.
  std::function<void(CloseReason reason)> on_closed = nullptr;
};

struct StepRequest {
  SessionId session = 0;
  // The new rows, [rows, d_model] row-major finite floats, rows >= 1: a prefill of many rows or
  // a one-row decode step.
  std::vector<float> rows = {};
  // When non-empty / non-zero, must equal the session's model name / version (the client's
  // check that it talks to the version it started with).
  std::string model = {};
  int64_t model_version = 0;
  StepCallback done = nullptr;
};

struct DecodeRuntimeOptions {
  // How iterations are formed (iteration_scheduler.h).
  batching::IterationSchedulerOptions scheduling = {};
  // The server's KV-cache budget, block size and longest session (kv_budget.h).
  KvBudgetOptions kv = {};
  // A session with no step queued or running for this long is closed (reason idle), in
  // microseconds of the runtime's clock. 0 = never.
  int64_t idle_timeout_us = int64_t{60} * 1000 * 1000;
  // Rows one session may have queued (accepted, not yet answered); Append refuses more with
  // ResourceExhausted. >= 1.
  int64_t max_queued_rows_per_session = 65536;
  // Sessions open at once, all owners together; Open refuses more with ResourceExhausted. Bounds
  // what sessions cost beyond their cache blocks (an empty session holds none, so the KV budget
  // alone would not bound them). >= 1.
  int64_t max_sessions = 4096;
  // When the loop finds fewer steps waiting than there are open sessions that the last two
  // iterations answered, it waits up to this long (microseconds of the runtime's clock, from when
  // it finds them) for the rest before it forms the iteration, unless other work (opens, closes,
  // drain) is pending. Clients that carry one session each (64 streams of one) send their next
  // steps a little apart; forming at once would run them in several small iterations, each
  // paying a forward's fixed cost. Two iterations, not one, so that a round once split in two
  // is waited for whole again. A step waits at most this long extra. 0 = form at once. >= 0.
  int64_t gather_delay_us = 0;
  // OpenMP threads of the forward passes (core::ExecutorOptions::compute_threads); 0 = the
  // calling thread's default. With ComputeTeams (DecodeRuntime::Create), the most threads a pass
  // asks for (0 = as many as the teams have); a pass runs on what it is granted.
  int compute_threads = 0;
};

// Lends compute threads to the decoding loop's forward passes. The server passes its one
// compute budget (server/runtime/compute_budget.h), which the Attend batch threads share, so
// decoding and batched work together never run more threads than the budget has. A pass holds
// its team only while it computes. Implementations must be thread-safe.
class ComputeTeams {
 public:
  virtual ~ComputeTeams() = default;
  // Blocks until a thread is free; then takes between 1 and `wanted` (>= 1) threads and returns
  // how many. Cannot fail.
  virtual int Acquire(int wanted) = 0;
  // Gives back `granted` threads taken by Acquire.
  virtual void Release(int granted) = 0;
};

// OK, or InvalidArgument naming the first bad field, what it expects and what it got.
absl::Status ValidateDecodeRuntimeOptions(const DecodeRuntimeOptions& options);

// A snapshot of the runtime's figures, for metrics and ModelInfo.
struct DecodeStats {
  int64_t kv_bytes_used = 0;      // Blocks in use, all model versions.
  int64_t kv_bytes_capacity = 0;  // The budget (options.kv.budget_bytes).
  int64_t kv_bytes_touched = 0;   // Blocks whose pages are resident (written, not given back).
  int64_t sessions_open = 0;      // Opened (loading or ready) and not closed.
  std::array<int64_t, kNumCloseReasons> sessions_closed = {};  // By CloseReason.
  int64_t steps_queued = 0;                                    // Accepted steps not yet answered.
  int64_t iterations = 0;      // Iterations run (each: one forward per model version/kind).
  int64_t prefill_tokens = 0;  // Rows computed in prefill chunks.
  int64_t decode_tokens = 0;   // Rows computed as one-row decode steps.
};

// What one iteration did (DecodeListener::OnIteration).
struct IterationReport {
  int64_t decode_tokens = 0;
  int64_t prefill_tokens = 0;
  int64_t slices = 0;    // Work items (one per session) in the iteration.
  int64_t forwards = 0;  // Forward passes run (one per model version and kind; more on retries).
  int64_t failed = 0;    // Items answered with an error.
  int64_t compute_us = 0;
};

// Observes the runtime (e.g. to feed Prometheus from the layer above). Methods are called on the
// loop thread and must be quick and must not call the runtime. Default: ignore.
class DecodeListener {
 public:
  virtual ~DecodeListener() = default;
  virtual void OnIteration(const IterationReport& /*report*/) {}
  // A step was answered `latency_us` after Append accepted it.
  virtual void OnStepAnswered(int64_t /*latency_us*/, const absl::Status& /*status*/) {}
  // A session's blocks were released.
  virtual void OnSessionClosed(SessionId /*id*/, CloseReason /*reason*/) {}
};

}  // namespace attnserve::decoding

#endif  // ATTNSERVE_SERVER_DECODING_DECODE_TYPES_H_
