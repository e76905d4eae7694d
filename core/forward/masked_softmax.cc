#include "core/forward/masked_softmax.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "core/util/exp_non_positive.h"
#include "core/util/per_isa_clones.h"
#include "core/util/row_max.h"

namespace attnserve::core {
namespace {

constexpr float kBlocked = -std::numeric_limits<float>::infinity();

inline uint16_t RoundBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// The exponentials and their sum: ExpShiftedSum, shared with the decode kernels' softmax.
ATTNSERVE_PER_ISA_CLONES int64_t MaskedSoftmaxRowClones(float* __restrict scores, int64_t keys,
                                                        const RowMask& mask,
                                                        uint16_t* __restrict bf16_out) {
  const int64_t limit = std::clamp<int64_t>(mask.visible_limit, 0, keys);
  const uint8_t* explicit_row = mask.explicit_row;
  int64_t visible = limit;
  if (explicit_row != nullptr) {
    visible = 0;
    for (int64_t j = 0; j < limit; ++j) {
      const bool open = explicit_row[j] != 0;
      scores[j] = open ? scores[j] : kBlocked;
      visible += open;
    }
  }
  if (visible == 0) {  // Nothing to attend to: exact zeros, never 0/0.
    if (bf16_out != nullptr) {
      std::memset(bf16_out, 0, keys * sizeof(uint16_t));
    } else {
      std::fill(scores, scores + keys, 0.0f);
    }
    return 0;
  }

  const float max_score = RowMax(scores, limit);
  const float sum = ExpShiftedSum(scores, limit, max_score);
  const float inverse = 1.0f / sum;
  if (bf16_out != nullptr) {
    for (int64_t j = 0; j < limit; ++j) bf16_out[j] = RoundBf16(scores[j] * inverse);
    std::memset(bf16_out + limit, 0, (keys - limit) * sizeof(uint16_t));
  } else {
    for (int64_t j = 0; j < limit; ++j) scores[j] *= inverse;
    std::fill(scores + limit, scores + keys, 0.0f);
  }
  return visible;
}

}  // namespace

int64_t MaskedSoftmaxRow(float* __restrict scores, int64_t keys, const RowMask& mask,
                         uint16_t* __restrict bf16_out) {
  return MaskedSoftmaxRowClones(scores, keys, mask, bf16_out);
}

}  // namespace attnserve::core
