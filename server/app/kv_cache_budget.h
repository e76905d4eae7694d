// The KV-cache budget of decoding sessions (--kv-cache-budget-mb): given, or derived from the
// memory this process may use (memory_limit.h) when not.
//
// Derived: an eighth of the container's memory limit (or of physical RAM without one), in whole
// MiB. An eighth because the budget is one term of docs/SERVER.md's "Memory" worst case: under
// the deployment's 2 GiB limit it is 256 MiB, which keeps that worst case (1,827 MiB with the
// defaults) within the limit; a larger limit gives sessions proportionally more.
//
// Thread-safe (pure functions).
#ifndef ATTNSERVE_SERVER_APP_KV_CACHE_BUDGET_H_
#define ATTNSERVE_SERVER_APP_KV_CACHE_BUDGET_H_

#include <cstdint>
#include <string>

#include "server/runtime/memory_limit.h"

namespace attnserve::server {

// The derived budget is memory / kKvCacheBudgetDivisor.
inline constexpr int64_t kKvCacheBudgetDivisor = 8;

struct KvCacheBudget {
  int64_t bytes = 0;
  // For the startup summary, e.g. "--kv-cache-budget-mb" or "1/8 of the cgroup v2 memory.max
  // limit (2048 MiB)".
  std::string source;
};

// `requested_bytes` > 0: that budget, as given. 0: memory.bytes / 8 rounded down to whole MiB,
// at least 1 MiB and at most 1 TiB (the flag's range).
KvCacheBudget ResolveKvCacheBudget(int64_t requested_bytes, const MemoryLimit& memory);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_KV_CACHE_BUDGET_H_
