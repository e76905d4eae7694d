// Internal to the paged decode kernels (paged_attention.cc, int8_dot_kernel.cc): the softmax of one
// query row's scores in place, with the semantics every decode kernel gives a row (blocked keys,
// rows with every key blocked, rows whose open keys have no finite score). Always inlined, so that
// it is compiled into each ISA clone or target of the kernel that calls it.
//
// Pure function; thread-safe. Include only from the kernels' .cc files.
#ifndef ATTNSERVE_CORE_KV_CACHE_ROW_SOFTMAX_H_
#define ATTNSERVE_CORE_KV_CACHE_ROW_SOFTMAX_H_

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/util/exp_non_positive.h"

namespace attnserve::core::row_softmax {

// What SoftmaxRow made of a row.
enum class RowOutcome {
  kProbabilities,  // A softmax over the open keys.
  kAllBlocked,     // Every key blocked: zero probabilities, the output must be zero.
  kNoFiniteScore,  // Open keys, but all their scores NaN or -∞: the output must be NaN.
};

// Turns scores[0, limit) (scaled; -∞ for blocked keys, `open_keys` of them not blocked; their
// maximum `max_score`, NaN scores ignored) into softmax probabilities in place and zeroes
// scores[limit, keys). The caller takes the maximum while it writes the scores: a separate pass
// would be scalar (NaN semantics keep it from vectorising) and cost a decode step ~5%.
[[gnu::always_inline]] inline RowOutcome SoftmaxRow(float* scores, int64_t limit, int64_t keys,
                                                    float max_score, int64_t open_keys) {
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  std::fill(scores + limit, scores + keys, 0.0f);
  if (max_score == kBlocked) {
    std::fill(scores, scores + limit, 0.0f);
    // Open keys whose scores are all NaN or -∞ (fp32 overflow in the projections or the dot
    // products) are not a fully masked row: answering zeros would pass the forward's finiteness
    // check with a wrong output. NaN makes it fail (OutOfRange), as an uncached forward does.
    return open_keys > 0 ? RowOutcome::kNoFiniteScore : RowOutcome::kAllBlocked;
  }
  // 0 for blocked keys (-∞).
  const float sum = ExpShiftedSum(scores, limit, max_score);
  const float inverse = 1.0f / sum;
  for (int64_t j = 0; j < limit; ++j) scores[j] *= inverse;
  return RowOutcome::kProbabilities;
}

// SoftmaxRow; for a row it leaves without probabilities, also its output out[0, dim): zeros for
// a row whose keys are all blocked, NaN for one with no finite score. True when the probabilities
// are there for the values to be weighed with.
[[gnu::always_inline]] inline bool SoftmaxRowOrAnswer(float* scores, int64_t limit, int64_t keys,
                                                      float max_score, int64_t open_keys,
                                                      float* out, int64_t dim) {
  switch (SoftmaxRow(scores, limit, keys, max_score, open_keys)) {
    case RowOutcome::kAllBlocked:
      std::fill(out, out + dim, 0.0f);
      return false;
    case RowOutcome::kNoFiniteScore:
      std::fill(out, out + dim, std::numeric_limits<float>::quiet_NaN());
      return false;
    case RowOutcome::kProbabilities:
      break;
  }
  return true;
}

// Marks scores[key, key + n) of keys the row's explicit mask blocks as -∞, and folds the rest
// into the row's maximum (a NaN score leaves it as it was) and its count of open keys.
[[gnu::always_inline]] inline void MaskAndMax(const uint8_t* explicit_row, int64_t key, int64_t n,
                                              float* scores, float& max_score, int64_t& open_keys) {
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  if (explicit_row == nullptr) {
    // Four independent chains of maxima: a single chain of dependent maxima through a long row
    // was ~7 % of the int8 kernel's time at 2048 keys. std::max(m, s) keeps m when s is NaN, as
    // below.
    float m[4] = {max_score, kBlocked, kBlocked, kBlocked};
    int64_t r = 0;
    for (; r + 4 <= n; r += 4) {
      for (int i = 0; i < 4; ++i) m[i] = std::max(m[i], scores[key + r + i]);
    }
    for (; r < n; ++r) m[0] = std::max(m[0], scores[key + r]);
    max_score = std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
    open_keys += n;
    return;
  }
  for (int64_t r = 0; r < n; ++r) {
    const bool open = explicit_row[key + r] != 0;
    if (!open) scores[key + r] = kBlocked;
    max_score = std::max(max_score, scores[key + r]);
    open_keys += open;
  }
}

}  // namespace attnserve::core::row_softmax

#endif  // ATTNSERVE_CORE_KV_CACHE_ROW_SOFTMAX_H_
