// int8 rows of a KV cache: each token's K (or V) row of one head is stored as head_dim int8 values
// and one scale, value ≈ int8 · scale (symmetric: no zero point, since K and V rows are centred
// near zero). The scale is max|x| / 127 rounded *up* to a bf16, so it is exact as stored, no value
// passes ±127, and each value is within scale / 2 of the original: the same error as an fp32 scale,
// in 2 bytes instead of 4 (a 64-wide head costs 66 bytes per row instead of bf16's 128).
//
// Plain functions on caller-owned arrays; thread-safe.
#ifndef ATTNSERVE_CORE_KV_CACHE_INT8_ROWS_H_
#define ATTNSERVE_CORE_KV_CACHE_INT8_ROWS_H_

#include <bit>
#include <cstdint>

namespace attnserve::core {

// Writes src[0, count) to dst as int8 (round to nearest, ties to even) and returns the
// scale's bf16 bits. An all-zero row gets scale 0. A row holding a NaN or an infinity gets a NaN
// scale and zero values, so that every value of it reads back as NaN (the forward passes report
// non-finite outputs; nothing is silently clamped).
uint16_t QuantizeInt8Row(const float* src, int64_t count, int8_t* dst);

// The scale a bf16 `bits` holds, exactly.
inline float Int8Scale(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// dst[i] = src[i] · Int8Scale(scale) for i < count.
void DequantizeInt8Row(const int8_t* src, uint16_t scale, int64_t count, float* dst);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_INT8_ROWS_H_
