// RowMax: the largest float of a row, 16 lanes at a time. Shared by the full forward's softmax
// (masked_softmax.cc) and the prefill chunks' (kv_cache/paged_attention.cc). GCC 12 compiles the
// plain std::max loop as scalar code (its NaN semantics forbid reordering one accumulator), and a
// loop over a float[16] of partial maxima as scalar loads and blends; GCC vector types (also
// understood by Clang, which builds the fuzzers) give vector compares and blends. 8-float
// vectors, two per 16 floats: GCC 12 lowers the compare and select of a 16-float vector element by
// element for AVX2.
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
  constexpr int64_t kHalf = 8, kLanes = 2 * kHalf;
  using Lanes = float __attribute__((vector_size(kHalf * sizeof(float))));
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  Lanes low = Lanes{} + kLowest, high = low;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Lanes x, y;
    std::memcpy(&x, row + i, sizeof x);
    std::memcpy(&y, row + i + kHalf, sizeof y);
    low = low < x ? x : low;  // A NaN x compares false and is skipped.
    high = high < y ? y : high;
  }
  float max = kLowest;
  for (int64_t l = 0; l < kHalf; ++l) max = std::max({max, low[l], high[l]});
  for (; i < n; ++i) max = std::max(max, row[i]);
  return max;
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_ROW_MAX_H_
