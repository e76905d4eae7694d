#include "server/app/kv_cache_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attnserve::server {

KvCacheBudget ResolveKvCacheBudget(int64_t requested_bytes, const MemoryLimit& memory) {
  if (requested_bytes > 0) return {.bytes = requested_bytes, .source = "--kv-cache-budget-mb"};
  constexpr int64_t kMiB = int64_t{1} << 20;
  const int64_t mib =
      std::clamp(memory.bytes / kKvCacheBudgetDivisor / kMiB, int64_t{1}, int64_t{1} << 20);
  return {.bytes = mib * kMiB,
          .source = absl::StrCat("1/", kKvCacheBudgetDivisor, " of ", memory.source, " (",
                                 memory.bytes / kMiB, " MiB)")};
}

}  // namespace attnserve::server
