// JSON arrays of numbers, fast: the tensors of the Open Inference Protocol's REST binding are
// arrays of thousands of numbers, which a general JSON parser reads one token at a time through
// strtod. Written once here for the server's REST conversion and the CLI's REST client.
//
// AppendJsonFloats writes FP32 values in their shortest form that reads back as the same value
// (WriteFloatText; -0 as "-0.0", since "-0" reads as the integer 0). ParseJsonNumberArray reads a
// (possibly nested) array of JSON numbers, each read as a double (std::from_chars, correctly
// rounded), so that rounding it to FP32 afterwards is what json.loads then numpy.float32 do.
// ExtractJsonNumberArrays lifts every such array that is the value of a given key out of a JSON
// text, so that the general parser sees only the small rest.
//
// Header-only; pure functions, thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_JSON_NUMBERS_H_
#define ATTNSERVE_CORE_UTIL_JSON_NUMBERS_H_

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/float_to_text.h"
#include "core/util/powers_of_ten.h"

namespace attnserve {

// Appends `values` as a JSON array to *out.
inline void AppendJsonFloats(std::span<const float> values, std::string* out) {
  const size_t start = out->size();
  // One more character than a number's most for the separator.
  out->resize(start + 2 + values.size() * (kMaxFloatTextChars + 1));
  char* cursor = out->data() + start;
  *cursor++ = '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) *cursor++ = ',';
    if (values[i] == 0.0f && std::signbit(values[i])) {
      std::memcpy(cursor, "-0.0", 4);
      cursor += 4;
      continue;
    }
    cursor = WriteFloatText(values[i], cursor);
  }
  *cursor++ = ']';
  out->resize(static_cast<size_t>(cursor - out->data()));
}

namespace json_numbers_internal {

inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The ASCII digits that start p[0, 8) (all eight bytes readable): their count n (0 to 8), and
// their value in *value. Eight bytes as one little-endian word: a byte is a digit when its high
// nibble is 3 and adding 6 leaves it there (a carry out of a byte only reaches the bytes after it,
// past the first non-digit). The n digits are shifted to the top of the word, the bytes below them
// reading as zeros, then pairs, quads and the two halves are combined with one multiply-shift each.
// No branch per digit: numbers end at varying digits, which a byte-at-a-time loop mispredicts.
inline int LeadingDigits(const char* p, uint64_t* value) {
  uint64_t word;
  std::memcpy(&word, p, sizeof word);
  if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
  constexpr uint64_t kHighNibbles = 0xF0F0F0F0F0F0F0F0, kThrees = 0x3333333333333333;
  const uint64_t not_digit =
      ((word & kHighNibbles) | (((word + 0x0606060606060606) & kHighNibbles) >> 4)) ^ kThrees;
  const int n = not_digit == 0 ? 8 : std::countr_zero(not_digit) / 8;
  if (n == 0) {
    *value = 0;
    return 0;
  }
  word = (word & 0x0F0F0F0F0F0F0F0F) << (8 * (8 - n));
  word = (word * (1 + (10 << 8))) >> 8;
  word = ((word & 0x00FF00FF00FF00FF) * (1 + (100 << 16))) >> 16;
  *value = ((word & 0x0000FFFF0000FFFF) * (1 + (10000ULL << 32))) >> 32;
  return n;
}

// Reads the JSON number (RFC 8259's grammar) at the start of [p, end) into *value, correctly
// rounded; returns its length, or 0 if none starts there. Most numbers take Clinger's fast path:
// with at most 2^53 in its digits and a power of ten up to 10^22, both are exact doubles and one
// multiplication or division rounds correctly. The others go to std::from_chars.
inline size_t ReadNumber(const char* p, const char* end, double* value) {
  const char* const start = p;
  const bool negative = p < end && *p == '-';
  if (negative) ++p;
  if (p >= end || !IsDigit(*p)) return 0;
  uint64_t mantissa = 0;
  int exponent = 0;
  bool exact = true;  // The mantissa holds every digit.
  // A digit is taken while the mantissa has fewer than 19 significant digits (< 10^18), so that
  // it fits 64 bits.
  constexpr uint64_t kTakeBelow = 1'000'000'000'000'000'000;
  const auto take = [&](char digit) {
    if (mantissa < kTakeBelow) {
      mantissa = mantissa * 10 + static_cast<uint64_t>(digit - '0');
      return true;
    }
    exact = false;  // A digit past the 19th: from_chars reads the number.
    return false;
  };
  // Up to eight digits at once while they would all be taken (a float's digits come in one or
  // two such runs); returns how many. The rest, one at a time.
  constexpr uint64_t kRunTakenBelow = 100'000'000'000;  // 10^11 · 10^8 + 10^8 <= 10^19.
  const auto take_runs = [&]() {
    int taken = 0;
    while (mantissa < kRunTakenBelow && end - p >= 8) {
      uint64_t chunk = 0;
      const int n = LeadingDigits(p, &chunk);
      mantissa = mantissa * kIntegerPowersOfTen[n] + chunk;
      p += n;
      taken += n;
      if (n < 8) break;
    }
    return taken;
  };
  if (*p == '0') {
    ++p;
  } else {
    take_runs();
    while (p < end && IsDigit(*p)) {
      if (!take(*p)) ++exponent;
      ++p;
    }
  }
  if (p < end && *p == '.') {
    ++p;
    if (p >= end || !IsDigit(*p)) return 0;
    exponent -= take_runs();
    while (p < end && IsDigit(*p)) {
      if (take(*p)) --exponent;
      ++p;
    }
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    ++p;
    const bool minus = p < end && *p == '-';
    if (p < end && (*p == '+' || *p == '-')) ++p;
    if (p >= end || !IsDigit(*p)) return 0;
    int written = 0;
    while (p < end && IsDigit(*p)) {
      if (written < 100000) written = written * 10 + (*p - '0');
      ++p;
    }
    exponent += minus ? -written : written;
  }
  const size_t length = static_cast<size_t>(p - start);
  if (exact && mantissa <= (uint64_t{1} << 53) && exponent >= -22 && exponent <= 22) {
    const double m = static_cast<double>(mantissa);
    const double magnitude = exponent < 0 ? m / PowerOfTen(-exponent) : m * PowerOfTen(exponent);
    *value = negative ? -magnitude : magnitude;
    return length;
  }
  if (std::from_chars(start, p, *value).ec != std::errc()) return 0;
  return length;
}

}  // namespace json_numbers_internal

// Reads the array at the start of `text` (text[0] == '['), nested at most `max_depth` deep, of
// numbers only, appending them flattened (row-major) to *out. Returns the array's length in
// characters, or 0 when it is anything else (strings, booleans, null, objects, malformed
// syntax, a number beyond FP32's range), leaving *out as it was: the caller's general parser
// then reads it and names what is wrong.
inline size_t ParseJsonNumberArray(std::string_view text, int max_depth, std::vector<double>* out) {
  using json_numbers_internal::IsSpace;
  const size_t restore = out->size();
  int depth = 0;
  // After '[' or ',' a value must come; after a value or ']' a ',' or ']'.
  bool expect_value = true;
  bool empty_allowed = true;  // Just after '['.
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (IsSpace(c)) {
      ++i;
    } else if (c == '[') {
      if (!expect_value || ++depth > max_depth) break;
      empty_allowed = true;
      ++i;
    } else if (c == ']') {
      if (expect_value && !empty_allowed) break;
      expect_value = false;
      empty_allowed = false;
      ++i;
      if (--depth == 0) return i;
    } else if (c == ',') {
      if (expect_value || depth == 0) break;
      expect_value = true;
      empty_allowed = false;
      ++i;
    } else {
      if (!expect_value || depth == 0) break;
      double value = 0;
      const size_t length =
          json_numbers_internal::ReadNumber(text.data() + i, text.data() + text.size(), &value);
      if (length == 0) break;
      if (!std::isfinite(static_cast<float>(value))) break;
      out->push_back(value);
      expect_value = false;
      empty_allowed = false;
      i += length;
    }
  }
  out->resize(restore);
  return 0;
}

// Every array of numbers that is the value of `key` ("key": [...], outside strings) in `json`
// is parsed (ParseJsonNumberArray) and appended to *arrays, in order of appearance, and replaced
// in the returned text by the object {"<marker>": i}, i its index in *arrays. Other values of
// `key` are left alone. The text is not otherwise checked: the general parser does that.
inline std::string ExtractJsonNumberArrays(std::string_view json, std::string_view key,
                                           std::string_view marker, int max_depth,
                                           std::vector<std::vector<double>>* arrays) {
  using json_numbers_internal::IsSpace;
  std::string reduced;
  size_t copied = 0;  // json[0, copied) is in `reduced`.
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] != '"') continue;
    // A string: find its end, honouring escapes.
    const size_t start = i;
    for (++i; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] == '\\') ++i;
    }
    if (i >= json.size()) break;
    if (json.substr(start + 1, i - start - 1) != key) continue;
    size_t j = i + 1;
    while (j < json.size() && IsSpace(json[j])) ++j;
    if (j >= json.size() || json[j] != ':') continue;
    ++j;
    while (j < json.size() && IsSpace(json[j])) ++j;
    if (j >= json.size() || json[j] != '[') continue;
    std::vector<double> values;
    const size_t length = ParseJsonNumberArray(json.substr(j), max_depth, &values);
    if (length == 0) continue;
    if (reduced.empty()) reduced.reserve(json.size() / 4 + 64);
    reduced.append(json.substr(copied, j - copied));
    reduced.append("{\"").append(marker).append("\":").append(std::to_string(arrays->size()));
    reduced.push_back('}');
    arrays->push_back(std::move(values));
    copied = j + length;
    i = copied - 1;
  }
  if (arrays->empty()) return std::string(json);
  reduced.append(json.substr(copied));
  return reduced;
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_JSON_NUMBERS_H_
