// RowMax: the largest float of a row, 16 lanes at a time. Shared by the full forward's softmax
// (masked_softmax.cc) and the prefill chunks' (kv_cache/paged_attention.cc). GCC 12 compiles the
// plain std::max loop as scalar code (its NaN semantics forbid reordering one accumulator), and a
// loop over a float[16] of partial maxima as scalar loads and blends; a GCC vector type (also
// understood by Clang, which builds the fuzzers) gives one vmaxps per 16 floats.
// Pure function; thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_ROW_MAX_H_
#define ATTNSERVE_CORE_UTIL_ROW_MAX_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace attnserve::core {

// The largest of row[0, n), NaN skipped as std::max skips it; -∞ when n is 0 or every value is
// NaN. Always inlined: it must be compiled into every ISA clone of its callers.
[[gnu::always_inline]] inline float RowMax(const float* row, int64_t n) {
  constexpr int64_t kLanes = 16;
  using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  Lanes lanes = Lanes{} + kLowest;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Lanes x;
    std::memcpy(&x, row + i, sizeof x);
    lanes = lanes < x ? x : lanes;  // A NaN x compares false and is skipped.
  }
  float max = kLowest;
  for (int64_t l = 0; l < kLanes; ++l) max = std::max(max, lanes[l]);
  for (; i < n; ++i) max = std::max(max, row[i]);
  return max;
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_ROW_MAX_H_
