// IterationRunner: executes one iteration of the decoding runtime (Triton's scheduler/executor
// split: IterationScheduler forms iterations, this runs them) and loads sessions' caches.
//
// Run() validates every slice before any forward pass (session attached, rows [count, d_model]
// and finite, KV budget and max_session_tokens), so a bad item fails alone; groups the valid
// ones by model version and kind (self- or cross-attention): one
// core::CachedAttentionExecutor::Forward per group; splits the output rows back to each item.
// When a group's pass fails (e.g. one item's values overflow), each of its items is run again
// alone so that only the culprit fails (a failed pass leaves every cache as it was). An item that
// fails after earlier chunks of it succeeded has its cache rolled back to where it started, so a
// step is all or nothing.
//
// Every item is answered through its callback exactly once (AnswerAll): when its last chunk
// succeeds, or when any chunk fails.
//
// Thread-safety: NOT thread-safe; one thread (the runtime's loop) uses it and the sessions'
// caches. Not owned: the budget, clock and listener, which outlive it.
#ifndef ATTNSERVE_SERVER_DECODING_ITERATION_RUNNER_H_
#define ATTNSERVE_SERVER_DECODING_ITERATION_RUNNER_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "core/kv_cache/cached_attention.h"
#include "server/batching/clock.h"
#include "server/decoding/decode_types.h"
#include "server/decoding/kv_budget.h"
#include "server/decoding/session.h"

namespace attnserve::decoding {

class IterationRunner {
 public:
  // `listener` and `teams` may be null. With `teams`, every forward pass and memory load runs on
  // a team acquired from it (up to compute_threads threads; 0 = all it has) and released after;
  // without, on compute_threads OpenMP threads (0 = the default).
  IterationRunner(KvBudget* budget, int compute_threads, batching::Clock* clock,
                  DecodeListener* listener, ComputeTeams* teams = nullptr);
  IterationRunner(const IterationRunner&) = delete;
  IterationRunner& operator=(const IterationRunner&) = delete;

  // Attaches each session to its version's pool and loads the cross-attention memories (one
  // LoadMemory per version; a failed one is retried alone). Returns each session's status; a
  // session that failed holds no blocks and is detached. Does not call on_ready.
  std::vector<absl::Status> Load(std::span<Session* const> sessions);

  // Runs `slices` (outputs written, failed items' caches rolled back, the budget refreshed,
  // the listener told) without answering anyone yet. `failed_unfinished` receives the keys whose
  // head item failed in a chunk that was not its last: that item is still queued, for the caller
  // to remove (keeping it alive until AnswerAll).
  IterationReport Run(std::vector<StepScheduler::Slice>& slices,
                      std::vector<SessionId>* failed_unfinished);
  // Answers every item of the last Run's `slices` that finished or failed, exactly once. Split
  // from Run so the caller can settle its own books first (what a callback's caller then reads
  // is current).
  void AnswerAll(std::vector<StepScheduler::Slice>& slices);

 private:
  // The checks before any forward pass; `pending_bytes` accumulates admitted growth.
  absl::Status Validate(const StepScheduler::Slice& slice, int64_t* pending_bytes);
  // One forward pass over `slices` (all of one model version and kind).
  absl::Status Forward(std::span<StepScheduler::Slice* const> slices);
  absl::Status LoadTogether(std::span<Session* const> sessions);
  void Answer(StepItem& item, absl::StatusOr<std::vector<float>> result);

  // Holds a team for one pass; `executor` computes on exactly its threads.
  class Team {
   public:
    explicit Team(IterationRunner& runner);
    ~Team();
    Team(const Team&) = delete;
    Team& operator=(const Team&) = delete;
    core::CachedAttentionExecutor& executor() { return *executor_; }

   private:
    ComputeTeams* const teams_;
    const int threads_;
    core::CachedAttentionExecutor* executor_;
  };

  KvBudget* const budget_;
  batching::Clock* const clock_;
  DecodeListener* const listener_;
  ComputeTeams* const teams_;
  const int compute_threads_;
  // One executor per team size (oneDNN's primitives are made for a thread count); index 0 is
  // compute_threads 0 (the default), used without teams.
  std::vector<std::unique_ptr<core::CachedAttentionExecutor>> executors_;
  // Scratch of one forward pass, reused.
  std::vector<float> query_, output_;
  std::vector<absl::Status> statuses_;  // Of the last Run, for AnswerAll.
};

}  // namespace attnserve::decoding

#endif  // ATTNSERVE_SERVER_DECODING_ITERATION_RUNNER_H_
