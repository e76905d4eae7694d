// CachedAttentionExecutor: forward passes of an AttentionLayer that read and extend a paged KV
// cache (kv_block_pool.h) — prefill, chunked prefill and decode steps of many sequences, mixed
// freely with sequences that use no cache, in one ragged batch.
//
// Self-attention, for sequence i with P_i tokens already cached and T_i new rows:
//   1. the new rows of the whole batch are projected by ONE matmul, [Σ T_i, d] · W_QKV (the
//      same packed matrix and ProjectionRunner as AttentionExecutor);
//   2. K and V of the new rows are appended to the sequence's blocks;
//   3. each new query j attends over the P_i + T_i cached keys (paged_attention.h); with
//      mask.causal it sees keys ≤ P_i + j; an explicit mask is [T_i, P_i + T_i] per sequence;
//   4. one output projection over all rows (multi-head).
// A sequence without cache (nullptr) attends over its own T_i rows as AttentionExecutor would.
// bf16 compute (layer.config().compute_type): as AttentionExecutor, the inputs are rounded to bf16
// for the bf16 weights, Q, K and V are rounded to bf16 after the f32-accumulated projection (the
// pool, which then stores bf16, keeps them exactly; the new rows are read back from it like any
// cached row, so a prefill followed by steps reads the same keys a full bf16 forward does), and
// the context is rounded to bf16 before W_O. Scores, softmax and the P·V accumulation stay f32;
// unlike the full forward the probabilities are not rounded to bf16 (no bf16 matmul reads them),
// so the weights output is f32 softmax values.
// Cross-attention: LoadMemory projects each sequence's memory · W_KV once into its cache; a
// Forward with cross_attention = true then projects only the queries (· W_Q) and attends over
// the cached memory without changing it.
//
// Not thread-safe: one executor per thread (it owns primitive caches and scratch), and the pool
// and sequences it is given must not be used concurrently elsewhere. Any number of executors may
// share one AttentionLayer.
#ifndef ATTNSERVE_CORE_KV_CACHE_CACHED_ATTENTION_H_
#define ATTNSERVE_CORE_KV_CACHE_CACHED_ATTENTION_H_

#include <memory>
#include <span>

#include "absl/status/status.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_executor.h"
#include "core/forward/attention_layer.h"
#include "core/kv_cache/kv_block_pool.h"

namespace attnserve::core {

struct CachedAttentionInputs {
  // The new rows of each sequence: T_i ≥ 1 rows of sequence i.
  RaggedBatch query = {};
  // One entry per sequence: its cache (grown by T_i tokens unless cross_attention), or nullptr
  // for a sequence that uses none. A sequence may appear at most once.
  std::span<KvSequence* const> caches = {};
  // Queries attend read-only over each sequence's cached memory (LoadMemory); every entry of
  // `caches` must then be non-null and non-empty, and mask.causal must be false.
  bool cross_attention = false;
  // causal: new query j of sequence i sees keys ≤ P_i + j. explicit_mask: one [T_i, S_i] block
  // per sequence, S_i = P_i + T_i (self, cached), cached length (cross) or T_i (no cache).
  AttentionMask mask = {};
  // Empty, or num_heads flags; a disabled head outputs zeros and zero weights.
  std::span<const bool> head_mask = {};
};

class CachedAttentionExecutor {
 public:
  // Uses options.compute_threads (OpenMP threads for the projections and the attention loop)
  // and options.max_cached_shapes (projection primitives kept).
  explicit CachedAttentionExecutor(const ExecutorOptions& options = {});
  ~CachedAttentionExecutor();
  CachedAttentionExecutor(const CachedAttentionExecutor&) = delete;
  CachedAttentionExecutor& operator=(const CachedAttentionExecutor&) = delete;

  // Runs `layer` on `in`, writing out.output ([Σ T_i, d]) and, when non-empty, out.weights
  // (per sequence [num_heads, T_i, S_i], concatenated). Errors, after which every cache and
  // `pool` are exactly as before the call:
  //   FailedPrecondition  `pool` belongs to another model version (layer config mismatch);
  //   InvalidArgument     inputs/outputs inconsistent (field, expected and received named);
  //   OutOfRange          a sequence would pass max_sequence_tokens, or the output is not finite;
  //   ResourceExhausted   the pool has too few free blocks for the batch's new tokens;
  //   Internal            oneDNN failed.
  absl::Status Forward(const AttentionLayer& layer, KvBlockPool& pool,
                       const CachedAttentionInputs& in, const AttentionOutputs& out);

  // Cross-attention: projects memory sequence i ([S_i, d]) · W_KV once into *caches[i], which
  // must be non-null, distinct and empty. Errors as Forward; on error every cache is unchanged.
  absl::Status LoadMemory(const AttentionLayer& layer, KvBlockPool& pool, const RaggedBatch& memory,
                          std::span<KvSequence* const> caches);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_CACHED_ATTENTION_H_
