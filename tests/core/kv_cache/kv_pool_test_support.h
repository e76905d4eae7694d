// Helpers of the KvBlockPool tests (kv_block_pool_test, kv_prefault_test).
#ifndef ATTNSERVE_TESTS_CORE_KV_CACHE_KV_POOL_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_CORE_KV_CACHE_KV_POOL_TEST_SUPPORT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/kv_cache/kv_block_pool.h"

namespace attnserve::testing {

// Reserve + Commit of `tokens` more tokens of `seq`: Reserve's error, or OK with seq.length grown.
inline absl::Status AppendTokens(core::KvBlockPool& pool, core::KvSequence& seq, int64_t tokens) {
  if (absl::Status s = pool.Reserve(seq, tokens); !s.ok()) return s;
  pool.Commit(seq, seq.length + tokens);
  return absl::OkStatus();
}

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_CORE_KV_CACHE_KV_POOL_TEST_SUPPORT_H_
