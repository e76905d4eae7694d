// KvBudget: the server's one KV-cache budget in bytes, shared by the block pools of every model
// version that has sessions.
//
// A core::KvBlockPool belongs to one model version (its block size follows d_model). KvBudget
// keeps one pool per version while sessions use it, created on the version's first session and
// destroyed with its last, so a version that a reload replaced gives its memory back as soon as
// its last session ends. Every pool's arena is allocated with budget_bytes (untouched arena
// pages cost no memory: blocks are handed out lowest-first and reused LIFO, so the pages touched
// follow the peak of what was in use). While two versions both have sessions, each pool keeps
// the pages its freed blocks touched: Refresh gives back the pages of free blocks (the least
// recently released first, core::KvBlockPool::DiscardFreeBlocks) whenever the resident pages of
// all pools together pass budget_bytes, so the cache's resident memory is one budget, not one
// per version (between two Refreshes it may pass by one iteration's growth). The limit that
// counts is enforced here, across pools:
// Admit refuses a growth that would take the blocks in use of all pools together past
// budget_bytes, with ResourceExhausted giving the budget and what is used. So the pools' own
// Reserve never runs out first, and no growth can exhaust the process's memory.
//
// Prefault keeps up to prefault_ahead_bytes of each pool's never-used blocks, just above its peak,
// with their pages already mapped, so that the iteration that first takes them (every
// block_tokens-th step of a wave of sessions that started together takes a fresh block for each)
// does not pay the kernel's first-touch faults inside the forward pass. It never takes the touched
// pages of all pools together past budget_bytes.
//
// Thread-safety: NOT thread-safe (the pools are not), except used_bytes(), touched_bytes(),
// capacity_bytes() and pools(), which any thread may read. The decoding runtime's loop thread is
// the only caller.
#ifndef ATTNSERVE_SERVER_DECODING_KV_BUDGET_H_
#define ATTNSERVE_SERVER_DECODING_KV_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kv_cache/kv_block_pool.h"
#include "core/model/model.h"

namespace attnserve::decoding {

struct KvBudgetOptions {
  // The most bytes of K/V blocks in use, all model versions together. >= 1 block of the widest
  // model. 256 MiB holds 32,768 tokens of d_model 512 (4 KiB of K and V per token).
  int64_t budget_bytes = int64_t{256} << 20;
  // Tokens per block (core::KvCacheOptions::block_tokens). >= 1.
  int64_t block_tokens = 16;
  // The most tokens one session may cache. >= 1; a longer growth fails with OutOfRange.
  int64_t max_session_tokens = 4096;
  // Bytes of blocks above a pool's peak in use whose pages Prefault maps ahead of need (whole
  // blocks, rounded down). >= 0; 0 = none. 16 MiB: four times the fresh blocks 64 sessions of
  // d_model 512 take in one fp32 step, or a 2048-token prompt's K/V in fp32.
  int64_t prefault_ahead_bytes = int64_t{16} << 20;
  // Transparent huge pages for the pools' arenas (core::KvCacheOptions::huge_pages). Default true.
  bool huge_pages = true;
};

class KvBudget {
 public:
  explicit KvBudget(const KvBudgetOptions& options);
  KvBudget(const KvBudget&) = delete;
  KvBudget& operator=(const KvBudget&) = delete;

  // The pool of `model`'s version, created if it has none, and counts one more session on it.
  // InvalidArgument/ResourceExhausted from core::KvBlockPool::Create (e.g. a budget smaller than
  // one block of this model, which the message names).
  absl::StatusOr<core::KvBlockPool*> Attach(const model::Model& model);
  // Releases `cache` to the pool of `model` and counts one session less; the pool is destroyed
  // with its last session. `model` must have been attached.
  void Detach(const model::Model& model, core::KvSequence& cache);

  // Whether `cache` (of `pool`) may grow by `new_tokens`, given `pending_bytes` already admitted
  // for this iteration and not yet allocated; on OK adds the growth to *pending_bytes.
  // OutOfRange when the session would pass max_session_tokens; ResourceExhausted "KV cache
  // budget exhausted: budget_bytes B, U bytes in use by S sessions, this step needs N more".
  absl::Status Admit(const core::KvBlockPool& pool, const core::KvSequence& cache,
                     int64_t new_tokens, int64_t* pending_bytes) const;

  // Whether some pool has blocks Prefault would touch.
  bool PrefaultPending() const;
  // Touches the pages of at least one and at most max(1, max_bytes / block bytes) never-used
  // blocks of the first pool with prefault work (core::KvBlockPool::Prefault); returns the bytes
  // touched, 0 when nothing is pending. O(pages touched): callers bound the time of one call with
  // max_bytes (1-10 µs per 4 KiB page on the 2-core VMs measured), and `stop` ends it sooner:
  // once *stop is true it returns before the next page (core::KvBlockPool::Prefault).
  int64_t Prefault(int64_t max_bytes, const std::atomic<bool>* stop = nullptr);

  // Recomputes used_bytes() from the pools (after a forward pass or a release), and gives back
  // free blocks' pages while the resident pages of all pools pass budget_bytes.
  void Refresh();

  // Bytes of blocks in use in all pools, as of the last Refresh/Attach/Detach.
  int64_t used_bytes() const { return used_bytes_.load(std::memory_order_relaxed); }
  // Bytes of blocks whose pages are resident in all pools (handed out at least once, or
  // prefaulted, and not given back since): what the cache holds of the resident set, as of the
  // last Refresh/Detach/Prefault.
  int64_t touched_bytes() const { return touched_bytes_.load(std::memory_order_relaxed); }
  int64_t capacity_bytes() const { return options_.budget_bytes; }
  // Model versions that have a pool.
  int64_t pools() const { return pool_count_.load(std::memory_order_relaxed); }
  const KvBudgetOptions& options() const { return options_; }

 private:
  struct Entry {
    std::unique_ptr<core::KvBlockPool> pool;
    int64_t sessions = 0;
  };
  static int64_t BlockBytes(const core::KvBlockPool& pool) { return pool.block_bytes(); }
  // The block up to which `pool` should be touched: prefault_ahead_bytes above its high-water mark.
  int64_t PrefaultTarget(const core::KvBlockPool& pool) const;
  // Bytes of pages touched in all pools, counted now.
  int64_t TouchedBytes() const;

  const KvBudgetOptions options_;
  std::map<const model::Model*, Entry> pools_;  // Keyed by version (a Model object).
  int64_t sessions_ = 0;
  std::atomic<int64_t> used_bytes_{0};
  std::atomic<int64_t> touched_bytes_{0};
  std::atomic<int64_t> pool_count_{0};
};

}  // namespace attnserve::decoding

#endif  // ATTNSERVE_SERVER_DECODING_KV_BUDGET_H_
