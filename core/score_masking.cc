#include "core/score_masking.h"

#include <algorithm>
#include <limits>

namespace attnserve::core {

int64_t MaskScoreRow(float* scores, int64_t keys, int64_t visible_limit,
                     const uint8_t* explicit_row) {
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  const int64_t limit = std::clamp<int64_t>(visible_limit, 0, keys);
  std::fill(scores + limit, scores + keys, kBlocked);
  if (explicit_row == nullptr) return limit;
  int64_t visible = 0;
  for (int64_t j = 0; j < limit; ++j) {
    const bool open = explicit_row[j] != 0;
    scores[j] = open ? scores[j] : kBlocked;
    visible += open;
  }
  return visible;
}

}  // namespace attnserve::core
