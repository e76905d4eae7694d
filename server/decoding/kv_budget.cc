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
                                 .max_sequence_tokens = options_.max_session_tokens});
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

void KvBudget::Refresh() {
  int64_t used = 0;
  for (const auto& [model, entry] : pools_) {
    used += (entry.pool->total_blocks() - entry.pool->free_blocks()) * BlockBytes(*entry.pool);
  }
  used_bytes_.store(used, std::memory_order_relaxed);
}

}  // namespace attnserve::decoding
