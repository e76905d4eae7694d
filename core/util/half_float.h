// Conversions between fp32 and the two 16-bit float formats: IEEE 754 binary16 ("F16", "fp16")
// and bfloat16 ("BF16"). Used by safetensors files (core/model) and by the wire formats of
// Tensor.raw (float_format.h), on the server and in the client library, hence header-only here.
// Pure functions on bit patterns; thread-safe.
//
// Written by hand as bit arithmetic rather than with _Float16/__bf16 or F16C intrinsics, so that
// every compiler the project supports (GCC 12, clang 14) gives the same results on every x86-64
// CPU, whatever the MXCSR's flush-to-zero / denormals-are-zero bits say.
#ifndef ATTNSERVE_CORE_UTIL_HALF_FLOAT_H_
#define ATTNSERVE_CORE_UTIL_HALF_FLOAT_H_

#include <bit>
#include <cstdint>

namespace attnserve {
// The formats' constants and rounding helpers: not part of the interface.
namespace half_float_internal {

constexpr uint32_t kF32SignMask = 0x8000'0000u;
constexpr uint32_t kF32AbsMask = 0x7fff'ffffu;
constexpr uint32_t kF32Infinity = 0x7f80'0000u;
constexpr uint32_t kF32MantissaMask = 0x007f'ffffu;
constexpr int kF32ExponentBias = 127;

constexpr uint16_t kF16SignMask = 0x8000u;
constexpr uint16_t kF16Infinity = 0x7c00u;
constexpr uint16_t kF16QuietBit = 0x0200u;
constexpr uint32_t kF16MantissaMask = 0x03ffu;
constexpr int kF16ExponentBias = 15;
// fp32 mantissa bits that binary16 drops.
constexpr int kF16DroppedBits = 23 - 10;

// |x| at or above 65520 (halfway between 65504, the largest binary16, and 2^16) rounds to ∞: the
// tie goes to the even neighbour, and 65504's mantissa is odd.
constexpr uint32_t kF16OverflowThreshold = 0x477f'f000u;
// |x| below 2^-14, the smallest normal binary16, becomes a subnormal or zero.
constexpr uint32_t kF16MinNormal = 0x3880'0000u;

constexpr uint16_t kBF16QuietBit = 0x0040u;

// Shifts `value` right by `shift` (1..31) bits, rounding to nearest with ties to even.
inline uint32_t ShiftRightRoundingToEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t remainder = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const bool round_up = remainder > half || (remainder == half && (kept & 1u) != 0);
  return kept + (round_up ? 1u : 0u);
}

// Binary16 subnormal m × 2^-24 as fp32: normalise m so its leading one becomes the implicit bit.
inline uint32_t HalfSubnormalToFloatBits(uint32_t mantissa) {
  int exponent = 1 - kF16ExponentBias;  // A subnormal's exponent is that of the smallest normal.
  while ((mantissa & 0x0400u) == 0) {
    mantissa <<= 1;
    --exponent;
  }
  mantissa &= kF16MantissaMask;
  return (static_cast<uint32_t>(exponent + kF32ExponentBias) << 23) | (mantissa << kF16DroppedBits);
}

// |value| (given as fp32 bits, finite, below 2^-14) as a binary16 subnormal or zero. The result
// may carry into the exponent field, which correctly encodes the smallest normal 2^-14.
inline uint16_t FloatBitsToHalfSubnormal(uint32_t abs_bits) {
  const int biased_exponent = static_cast<int>(abs_bits >> 23);
  // The value is significand × 2^(e − 150); in binary16 subnormal units of 2^-24 that is
  // significand >> (126 − e).
  const int shift = 126 - biased_exponent;
  // Below 2^-25 (shift ≥ 25), even the largest significand is under half a unit: zero. This also
  // covers fp32 zeros and subnormals, whose missing implicit bit would not matter anyway.
  if (shift > 24) return 0;
  const uint32_t significand = (abs_bits & kF32MantissaMask) | 0x0080'0000u;
  return static_cast<uint16_t>(ShiftRightRoundingToEven(significand, shift));
}

}  // namespace half_float_internal

// Exact: every binary16 value (subnormals, ±0, ±∞, NaN with its payload) has an fp32 equal.
inline float HalfToFloat(uint16_t bits) {
  using namespace half_float_internal;
  const uint32_t sign = static_cast<uint32_t>(bits & kF16SignMask) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & kF16MantissaMask;
  uint32_t magnitude;
  if (exponent == 0x1fu) {
    // ∞ or NaN; a NaN keeps its payload, including the quiet bit.
    magnitude = kF32Infinity | (mantissa << kF16DroppedBits);
  } else if (exponent == 0) {
    magnitude = mantissa == 0 ? 0 : HalfSubnormalToFloatBits(mantissa);
  } else {
    magnitude =
        ((exponent - kF16ExponentBias + kF32ExponentBias) << 23) | (mantissa << kF16DroppedBits);
  }
  return std::bit_cast<float>(sign | magnitude);
}

// Rounds to nearest, ties to even; |x| ≥ 65520 becomes ±∞, fp32 values below half the smallest
// binary16 subnormal (2^-25) become ±0, NaN stays NaN (quiet, sign and top payload bits kept).
inline uint16_t FloatToHalf(float value) {
  using namespace half_float_internal;
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits & kF32SignMask) >> 16);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > kF32Infinity) {
    // Keep the payload's top bits but force the quiet bit: a payload living only in the dropped
    // low bits would otherwise turn the NaN into ∞.
    const auto payload = static_cast<uint16_t>((abs_bits >> kF16DroppedBits) & kF16MantissaMask);
    return static_cast<uint16_t>(sign | kF16Infinity | kF16QuietBit | payload);
  }
  if (abs_bits >= kF16OverflowThreshold) return static_cast<uint16_t>(sign | kF16Infinity);
  if (abs_bits < kF16MinNormal) {
    return static_cast<uint16_t>(sign | FloatBitsToHalfSubnormal(abs_bits));
  }
  // Rebias the exponent, then round the mantissa; a carry out of the mantissa correctly bumps
  // the exponent, and cannot reach ∞ because of the threshold above.
  const uint32_t rebiased =
      abs_bits - (static_cast<uint32_t>(kF32ExponentBias - kF16ExponentBias) << 23);
  return static_cast<uint16_t>(sign | ShiftRightRoundingToEven(rebiased, kF16DroppedBits));
}

// Exact: bfloat16 is the upper half of an fp32.
inline float BFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Rounds to nearest, ties to even; NaN stays NaN (quiet), overflow becomes ±∞.
// Branch-free (the NaN case is a select), so that loops over it vectorise: EncodeFloats' bf16
// tensors take half the time of the branching form, with the same result for all 2^32 inputs.
inline uint16_t FloatToBFloat16(float value) {
  using namespace half_float_internal;
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // Ties to even: just under half an ulp, plus one when the kept half is odd. Rounding the full
  // pattern also handles overflow: values past the largest bfloat16 carry into the exponent and
  // become ∞, and ∞ itself has a zero low half.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // As for binary16: truncating a NaN whose payload is all in the low half would give ∞.
  const uint32_t quiet_nan = (bits >> 16) | kBF16QuietBit;
  return static_cast<uint16_t>((bits & kF32AbsMask) > kF32Infinity ? quiet_nan : rounded);
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_HALF_FLOAT_H_
