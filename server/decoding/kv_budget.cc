#include "server/decoding/kv_budget.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve::decoding {

KvBudget::KvBudget(const KvBudgetOptions& options) : options_(options) {}

absl::StatusOr<core::KvBlockPool*> KvBudget::Attach(const model::Model& model) {
  auto it = pools_.find(&model);
  if (it == pools_.end()) {
    absl::StatusOr<std::unique_ptr<core::KvBlockPool>> pool = core::KvBlockPool::Create(
        model.config.attention, {.block_tokens = options_.block_tokens,
                                 .budget_bytes = options_.budget_bytes,
                                 .max_sequence_tokens = options_.max_session_tokens,
                                 .int8 = model.config.kv_cache_dtype == model::KvCacheDtype::kInt8,
                                 .huge_pages = options_.huge_pages});
    if (!pool.ok()) {
      return absl::Status(pool.status().code(),
                          absl::StrCat("KV cache for model \"", model.name, "\" version ",
                                       model.version, ": ", pool.status().message()));
    }
    it = pools_.emplace(&model, Entry{std::move(*pool), 0}).first;
    pool_count_.store(static_cast<int64_t>(pools_.size()), std::memory_order_relaxed);
  }
  ++it->second.sessions;
  ++sessions_;
  return it->second.pool.get();
}

void KvBudget::Detach(const model::Model& model, core::KvSequence& cache) {
  auto it = pools_.find(&model);
  if (it == pools_.end()) return;
  it->second.pool->Release(cache);
  --sessions_;
  if (--it->second.sessions == 0) {
    pools_.erase(it);
    pool_count_.store(static_cast<int64_t>(pools_.size()), std::memory_order_relaxed);
  }
  Refresh();
}

absl::Status KvBudget::Admit(const core::KvBlockPool& pool, const core::KvSequence& cache,
                             int64_t new_tokens, int64_t* pending_bytes) const {
  const int64_t tokens = cache.length + new_tokens;
  if (tokens > options_.max_session_tokens) {
    return absl::OutOfRangeError(absl::StrCat("session would cache ", tokens,
                                              " tokens, more than max_session_tokens (",
                                              options_.max_session_tokens, ")"));
  }
  const int64_t block_tokens = pool.options().block_tokens;
  const int64_t blocks = (tokens + block_tokens - 1) / block_tokens;
  const int64_t need =
      std::max<int64_t>(0, blocks - static_cast<int64_t>(cache.blocks.size())) * BlockBytes(pool);
  const int64_t used = used_bytes() + *pending_bytes;
  if (used + need > options_.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache budget exhausted: budget_bytes ", options_.budget_bytes, ", ", used,
                     " bytes in use by ", sessions_, " sessions, this step needs ", need, " more"));
  }
  *pending_bytes += need;
  return absl::OkStatus();
}

int64_t KvBudget::PrefaultTarget(const core::KvBlockPool& pool) const {
  return std::min(pool.total_blocks(),
                  pool.high_water_blocks() + options_.prefault_ahead_bytes / BlockBytes(pool));
}

int64_t KvBudget::TouchedBytes() const {
  int64_t touched = 0;
  for (const auto& [model, entry] : pools_) {
    touched += entry.pool->resident_blocks() * BlockBytes(*entry.pool);
  }
  return touched;
}

bool KvBudget::PrefaultPending() const {
  if (options_.prefault_ahead_bytes == 0) return false;
  const int64_t room = options_.budget_bytes - TouchedBytes();
  for (const auto& [model, entry] : pools_) {
    const core::KvBlockPool& pool = *entry.pool;
    if (pool.touched_blocks() < PrefaultTarget(pool) && BlockBytes(pool) <= room) return true;
  }
  return false;
}

int64_t KvBudget::Prefault(int64_t max_bytes, const std::atomic<bool>* stop) {
  if (options_.prefault_ahead_bytes == 0) return 0;
  const int64_t room = options_.budget_bytes - TouchedBytes();
  for (auto& [model, entry] : pools_) {
    core::KvBlockPool& pool = *entry.pool;
    const int64_t block_bytes = BlockBytes(pool);
    const int64_t max_blocks =
        std::min(std::max<int64_t>(1, max_bytes / block_bytes), room / block_bytes);
    if (const int64_t blocks = pool.Prefault(PrefaultTarget(pool), max_blocks, stop); blocks > 0) {
      touched_bytes_.store(TouchedBytes(), std::memory_order_relaxed);
      return blocks * block_bytes;
    }
  }
  return 0;
}

void KvBudget::Refresh() {
  int64_t used = 0;
  for (const auto& [model, entry] : pools_) {
    used += (entry.pool->total_blocks() - entry.pool->free_blocks()) * BlockBytes(*entry.pool);
  }
  used_bytes_.store(used, std::memory_order_relaxed);
  // Blocks in use never pass the budget (Admit), so giving back free pages always gets there.
  int64_t excess = TouchedBytes() - options_.budget_bytes;
  for (auto& [model, entry] : pools_) {
    if (excess <= 0) break;
    const int64_t block_bytes = BlockBytes(*entry.pool);
    excess -= entry.pool->DiscardFreeBlocks((excess + block_bytes - 1) / block_bytes) * block_bytes;
  }
  touched_bytes_.store(TouchedBytes(), std::memory_order_relaxed);
}

}  // namespace attnserve::decoding
