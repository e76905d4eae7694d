#include "core/forward/bf16_conversion.h"

#include <bit>

#include "core/util/per_isa_clones.h"

namespace attnserve::core {
namespace {

// The bits of the bf16 nearest to `bits` (an fp32's), ties to even, in the top 16 bits.
inline uint32_t RoundedBits(uint32_t bits) { return bits + 0x7fffu + ((bits >> 16) & 1u); }

// Branch-free integer arithmetic, so that GCC vectorises the loops; compiled per ISA level since
// the baseline build would give them 4 lanes of SSE2 with shuffles (they run serially between
// the forward's parallel regions: once per input row, per projected row and per context row).
ATTNSERVE_PER_ISA_CLONES void RoundToBf16Clones(const float* __restrict src, int64_t count,
                                                uint16_t* __restrict dst) {
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = static_cast<uint16_t>(RoundedBits(std::bit_cast<uint32_t>(src[i])) >> 16);
  }
}

ATTNSERVE_PER_ISA_CLONES void RoundToBf16InPlaceClones(float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    values[i] = std::bit_cast<float>(RoundedBits(std::bit_cast<uint32_t>(values[i])) & 0xffff0000u);
  }
}

ATTNSERVE_PER_ISA_CLONES void WidenBf16Clones(const uint16_t* __restrict src, int64_t count,
                                              float* __restrict dst) {
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = std::bit_cast<float>(static_cast<uint32_t>(src[i]) << 16);
  }
}

}  // namespace

void RoundToBf16(const float* __restrict src, int64_t count, uint16_t* __restrict dst) {
  RoundToBf16Clones(src, count, dst);
}

void RoundToBf16InPlace(float* values, int64_t count) { RoundToBf16InPlaceClones(values, count); }

void WidenBf16(const uint16_t* __restrict src, int64_t count, float* __restrict dst) {
  WidenBf16Clones(src, count, dst);
}

}  // namespace attnserve::core
