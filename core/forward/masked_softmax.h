// MaskedSoftmaxRow: the one pass over a row of attention scores between QKᵀ and P·V — masking,
// max, exp, sum and normalisation — done while the row is in L1 instead of as separate sweeps
// over the whole score tile (a masking pass, then oneDNN's softmax, then zeroing blocked rows).
// Pure function on caller-owned memory; thread-safe. Internal to the core.
#ifndef ATTNSERVE_CORE_FORWARD_MASKED_SOFTMAX_H_
#define ATTNSERVE_CORE_FORWARD_MASKED_SOFTMAX_H_

#include <cstdint>

namespace attnserve::core {

// Which keys of a score row are visible: those j < visible_limit (the causal limit; pass the
// row's length for none) whose `explicit_row[j]` is non-zero (null: all of them).
struct RowMask {
  int64_t visible_limit;
  const uint8_t* explicit_row = nullptr;
};

// Replaces the `keys` (already scaled) f32 scores with softmax probabilities over the visible
// keys: blocked keys get exactly 0, and a row with no visible key is all zeros (not NaN). With
// `bf16_out` null the probabilities overwrite `scores`; otherwise they are written to `bf16_out`
// (`keys` elements, rounded to nearest even) and `scores` is left as scratch. Scores must not be
// NaN or +∞ (the executor rejects non-finite inputs). Returns the number of visible keys.
int64_t MaskedSoftmaxRow(float* scores, int64_t keys, const RowMask& mask, uint16_t* bf16_out);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_MASKED_SOFTMAX_H_
