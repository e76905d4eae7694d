#include "core/kv_cache/int8_rows.h"

#include <algorithm>
#include <cmath>

#include "core/util/per_isa_clones.h"

namespace attnserve::core {
namespace {

constexpr uint16_t kNanScale = 0x7fc0;

// The bf16 bits of the smallest bf16 >= `x` (x > 0 and finite).
uint16_t RoundUpToBf16(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0xffffu) != 0) bits = (bits & 0xffff0000u) + 0x10000u;  // Positive: up = away from 0.
  return static_cast<uint16_t>(bits >> 16);
}

// Per ISA level: the max and the scaling loop vectorise (a token's rows are written once per step).
ATTNSERVE_PER_ISA_CLONES uint16_t QuantizeInt8RowClones(const float* src, int64_t count,
                                                        int8_t* dst) {
  float max_abs = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < count; ++i) {
    max_abs = std::max(max_abs, std::fabs(src[i]));
    finite &= std::isfinite(src[i]);
  }
  if (!finite || max_abs == 0.0f) {
    std::fill(dst, dst + count, int8_t{0});
    return finite ? uint16_t{0} : kNanScale;
  }
  const uint16_t scale = RoundUpToBf16(max_abs / 127.0f);
  const float inverse = 1.0f / Int8Scale(scale);
  for (int64_t i = 0; i < count; ++i) {
    // |src[i] · inverse| <= 127 up to one rounding of the product: the clamp only catches that.
    const float q = std::clamp(std::nearbyint(src[i] * inverse), -127.0f, 127.0f);
    dst[i] = static_cast<int8_t>(q);
  }
  return scale;
}

ATTNSERVE_PER_ISA_CLONES void DequantizeInt8RowClones(const int8_t* src, uint16_t scale,
                                                      int64_t count, float* dst) {
  const float s = Int8Scale(scale);
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]) * s;
}

}  // namespace

uint16_t QuantizeInt8Row(const float* src, int64_t count, int8_t* dst) {
  return QuantizeInt8RowClones(src, count, dst);
}

void DequantizeInt8Row(const int8_t* src, uint16_t scale, int64_t count, float* dst) {
  DequantizeInt8RowClones(src, scale, count, dst);
}

}  // namespace attnserve::core
