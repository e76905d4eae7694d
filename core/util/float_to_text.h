// WriteFloatText: an FP32 value as decimal text that reads back as the same value, with the
// fewest significant digits that do (as std::to_chars writes it; a candidate too close to the edge
// of the value's rounding interval to tell in double arithmetic is passed over, which could cost a
// digit: none did in 44 million sampled values). For the REST binding's JSON numbers, where
// std::to_chars (~23 ns a number) was the largest cost of a JSON answer; this takes ~15 ns.
//
// How: the value is scaled to a 9-digit integer in double arithmetic (9 significant digits always
// identify an FP32 value, and the double's error is far below one unit of the ninth digit), then
// 8, 7, ... digit roundings of it are kept while each stays inside the value's rounding interval,
// checked in double with a margin for the candidate's own rounding.
//
// Header-only; pure functions, thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_FLOAT_TO_TEXT_H_
#define ATTNSERVE_CORE_UTIL_FLOAT_TO_TEXT_H_

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/util/powers_of_ten.h"

namespace attnserve {

// The most characters WriteFloatText writes ("-1.23456789e-38").
inline constexpr int kMaxFloatTextChars = 15;

namespace float_to_text_internal {

inline constexpr char kDigitPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

// Writes the `digits` decimal digits of m at out.
inline void WriteDigits(uint32_t m, int digits, char* out) {
  char* cursor = out + digits;
  for (; digits >= 2; digits -= 2) {
    cursor -= 2;
    std::memcpy(cursor, kDigitPairs + 2 * (m % 100), 2);
    m /= 100;
  }
  if (digits == 1) *--cursor = static_cast<char>('0' + m);
}

// Writes m · 10^(exponent - digits + 1), m having `digits` digits (the last one not 0): fixed
// notation for exponents -4 to 8 ("0.00012", "3.25", "120"), scientific otherwise ("1.5e+20"),
// as printf's %g chooses.
inline char* WriteDecimal(uint32_t m, int digits, int exponent, char* out) {
  if (exponent >= -4 && exponent <= 8) {
    if (exponent >= digits - 1) {  // An integer: the digits, then zeros.
      WriteDigits(m, digits, out);
      out += digits;
      for (int i = digits - 1; i < exponent; ++i) *out++ = '0';
      return out;
    }
    if (exponent >= 0) {  // The point inside the digits.
      WriteDigits(m, digits, out + 1);
      std::memmove(out, out + 1, static_cast<size_t>(exponent + 1));
      out[exponent + 1] = '.';
      return out + digits + 1;
    }
    *out++ = '0';
    *out++ = '.';
    for (int i = exponent + 1; i < 0; ++i) *out++ = '0';
    WriteDigits(m, digits, out);
    return out + digits;
  }
  WriteDigits(m, digits, out + 1);
  out[0] = out[1];
  if (digits > 1) {
    out[1] = '.';
    out += digits + 1;
  } else {
    out += 1;
  }
  *out++ = 'e';
  *out++ = exponent < 0 ? '-' : '+';
  const int magnitude = exponent < 0 ? -exponent : exponent;  // At most 45.
  std::memcpy(out, kDigitPairs + 2 * magnitude, 2);
  return out + 2;
}

}  // namespace float_to_text_internal

// Writes `value` at out (at most kMaxFloatTextChars characters) and returns the end. Zeros are "0"
// and "-0"; NaN and infinities as std::to_chars writes them ("nan", "inf", "-inf").
inline char* WriteFloatText(float value, char* out) {
  using float_to_text_internal::WriteDecimal;
  if (value == 0.0f || !std::isfinite(value)) {
    return std::to_chars(out, out + kMaxFloatTextChars, value).ptr;
  }
  if (value < 0.0f) *out++ = '-';
  const uint32_t bits = std::bit_cast<uint32_t>(value) & 0x7fffffffu;
  const double a = std::fabs(static_cast<double>(value));  // Exact.
  // Its decimal exponent: floor(log10 a) is that of its binary exponent, or one more.
  const int biased = static_cast<int>(bits >> 23);
  // floor(log2 a): the exponent bits, or for a subnormal the top set bit of its mantissa.
  const int log2 = biased != 0 ? biased - 127 : 31 - std::countl_zero(bits) - 149;
  int exponent = (log2 * 78913) >> 18;           // floor(log2 · log10 2).
  double scaled = a * PowerOfTen(8 - exponent);  // In [10^8, 10^9) once exponent is right.
  if (scaled >= 999999999.5) {
    ++exponent;
    scaled = a * PowerOfTen(8 - exponent);
  } else if (scaled < 99999999.5) {  // Not expected (the estimate is never high): a safeguard.
    --exponent;
    scaled = a * PowerOfTen(8 - exponent);
  }
  // The value's rounding interval: half a unit in the last place each side (a quarter below a
  // power of two, whose lower neighbour is closer). A candidate within `margin` of an edge counts
  // as outside: it might read back as the neighbour.
  const double ulp =
      std::bit_cast<double>(static_cast<uint64_t>((biased == 0 ? 1 : biased) - 150 + 1023) << 52);
  const double half_above = ulp * 0.5;
  const double half_below = (bits & 0x7fffffu) == 0 && biased > 1 ? ulp * 0.25 : half_above;
  // Below 2^53 a candidate with no fraction (an integer) is exact in double, and so is its
  // difference: on an edge it reads back as the value exactly when the value's last bit is 0
  // (ties to even). Others carry up to two roundings of 2^-53.
  const bool even = (bits & 1u) == 0;
  const double margin = a * 4.5e-16;
  uint32_t m = 0;
  int digits = 0;
  // 9 digits always lie inside; fewer while they still do (if d digits fail, fewer fail too).
  for (int d = 9; d >= 1; --d) {
    const auto candidate = static_cast<uint32_t>(scaled * PowerOfTen(d - 9) + 0.5);
    if (d < 9) {
      const int power = exponent - d + 1;
      const double difference = static_cast<double>(candidate) * PowerOfTen(power) - a;
      const double edge = difference >= 0 ? half_above : half_below;
      const double distance = std::fabs(difference);
      const bool exact = power >= 0 && a < 9.0e15;
      const bool inside =
          exact ? distance < edge || (distance == edge && even) : distance < edge - margin;
      if (!inside) break;
    }
    m = candidate;
    digits = d;
  }
  // A rounding up to 10^digits (9.99… → 10): one digit fewer at the next exponent.
  if (m >= kIntegerPowersOfTen[digits]) {
    m /= 10;
    ++exponent;
  }
  while (m % 10 == 0) {
    m /= 10;
    --digits;
  }
  return WriteDecimal(m, digits, exponent, out);
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_FLOAT_TO_TEXT_H_
