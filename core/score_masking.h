// Row-wise helpers applied to attention scores between QKᵀ and the softmax, and after it.
// Pure functions on caller-owned memory; thread-safe.
#ifndef ATTNSERVE_CORE_SCORE_MASKING_H_
#define ATTNSERVE_CORE_SCORE_MASKING_H_

#include <cstdint>

namespace attnserve::core {

// Blocks keys in one score row of `keys` floats by writing -∞: every key j >= visible_limit
// (the causal limit; pass `keys` for no limit) and, when `explicit_row` is not null, every key
// whose entry is 0. Returns the number of keys left visible.
int64_t MaskScoreRow(float* scores, int64_t keys, int64_t visible_limit,
                     const uint8_t* explicit_row);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_SCORE_MASKING_H_
