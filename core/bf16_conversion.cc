#include "core/bf16_conversion.h"

#include <bit>

namespace attnserve::core {

// Written as branch-free integer arithmetic so that GCC vectorises both loops at -O2 (16 lanes
// with AVX-512); they run once per input row and once per weights-output element.
void RoundToBf16(const float* __restrict src, int64_t count, uint16_t* __restrict dst) {
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(src[i]);
    const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    dst[i] = static_cast<uint16_t>((bits + rounding) >> 16);
  }
}

void WidenBf16(const uint16_t* __restrict src, int64_t count, float* __restrict dst) {
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = std::bit_cast<float>(static_cast<uint32_t>(src[i]) << 16);
  }
}

}  // namespace attnserve::core
