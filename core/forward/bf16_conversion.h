// bf16 conversion: fp32 <-> bfloat16 (the top 16 bits of an IEEE fp32) for the bf16 compute path,
// where the API's fp32 inputs become bf16 matmul sources and bf16 probabilities become the fp32
// weights output.
//
// Plain functions on caller-owned arrays; thread-safe. Internal to the core.
#ifndef ATTNSERVE_CORE_FORWARD_BF16_CONVERSION_H_
#define ATTNSERVE_CORE_FORWARD_BF16_CONVERSION_H_

#include <cstdint>

namespace attnserve::core {

// dst[i] = src[i] rounded to the nearest bf16, ties to even. Values must be finite (the executor
// validates inputs first); a NaN may come out as an infinity. Arrays must not overlap.
void RoundToBf16(const float* src, int64_t count, uint16_t* dst);

// values[i] replaced by its nearest bf16 (as RoundToBf16), kept as an fp32 (the low 16 bits 0).
void RoundToBf16InPlace(float* values, int64_t count);

// dst[i] = src[i] widened exactly to fp32. Arrays must not overlap.
void WidenBf16(const uint16_t* src, int64_t count, float* dst);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_BF16_CONVERSION_H_
