// Conversions between fp32 and the two 16-bit float formats safetensors files carry: IEEE 754
// binary16 ("F16") and bfloat16 ("BF16"). Pure functions on bit patterns; thread-safe.
#ifndef ATTNSERVE_CORE_MODEL_HALF_FLOAT_H_
#define ATTNSERVE_CORE_MODEL_HALF_FLOAT_H_

#include <cstdint>

namespace attnserve::model {

// Exact: every binary16 value (subnormals, ±0, ±∞, NaN) has an fp32 equal.
float HalfToFloat(uint16_t bits);
// Rounds to nearest, ties to even; values beyond the binary16 range become ±∞, NaN stays NaN.
uint16_t FloatToHalf(float value);

// Exact: bfloat16 is the upper half of an fp32.
float BFloat16ToFloat(uint16_t bits);
// Rounds to nearest, ties to even; NaN stays NaN (quiet), overflow becomes ±∞.
uint16_t FloatToBFloat16(float value);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_HALF_FLOAT_H_
