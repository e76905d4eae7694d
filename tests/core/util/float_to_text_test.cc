// WriteFloatText against std::from_chars (correctly rounded) and std::to_chars (shortest): every
// value reads back bit for bit, directly as FP32 and through a double (as json.loads then
// numpy.float32 read it), with as many significant digits as the shortest form; and the text is a
// JSON number.
#include "core/util/float_to_text.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

std::string Text(float value) {
  char buffer[kMaxFloatTextChars + 1];
  char* end = WriteFloatText(value, buffer);
  EXPECT_LE(end - buffer, kMaxFloatTextChars);
  return std::string(buffer, end);
}

// Significant digits of a decimal text, leading and trailing zeros not counted.
int SignificantDigits(std::string_view text) {
  std::string digits;
  for (char c : text.substr(0, text.find('e'))) {
    if (c >= '0' && c <= '9' && !(digits.empty() && c == '0')) digits.push_back(c);
  }
  while (!digits.empty() && digits.back() == '0') digits.pop_back();
  return static_cast<int>(digits.size());
}

// RFC 8259's number: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
bool IsJsonNumber(std::string_view text) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t first = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > first;
  };
  if (i < text.size() && text[i] == '-') ++i;
  if (i < text.size() && text[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < text.size() && text[i] == '.' && (++i, !digits())) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == text.size();
}

// Checks one value; returns whether its text has one digit more than the shortest form.
bool CheckOne(uint32_t bits, int* failures) {
  const float value = std::bit_cast<float>(bits);
  const std::string text = Text(value);
  float as_float = 0.0f;
  double as_double = 0.0;
  std::from_chars(text.data(), text.data() + text.size(), as_float);
  std::from_chars(text.data(), text.data() + text.size(), as_double);
  char shortest[64];
  char* end =
      std::to_chars(shortest, shortest + sizeof shortest, value, std::chars_format::scientific).ptr;
  const int extra =
      SignificantDigits(text) - SignificantDigits(std::string_view(shortest, end - shortest));
  const bool ok = std::bit_cast<uint32_t>(as_float) == bits &&
                  std::bit_cast<uint32_t>(static_cast<float>(as_double)) == bits &&
                  (extra == 0 || extra == 1);
  if (!ok && ++*failures <= 10) {
    ADD_FAILURE() << std::hex << bits << ": " << text << " (shortest " << shortest << ")";
  }
  return extra == 1;
}

// Every 4,099th bit pattern (every exponent, subnormals included) and a million random ones.
TEST(FloatToTextTest, ReadsBackExactlyInTheShortestForm) {
  int failures = 0;
  int64_t checked = 0, longer = 0;
  const auto check = [&](uint32_t bits) {
    if (!std::isfinite(std::bit_cast<float>(bits))) return;
    ++checked;
    longer += CheckOne(bits, &failures);
  };
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    check(static_cast<uint32_t>(bits));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) check(static_cast<uint32_t>(rng()));
  EXPECT_EQ(failures, 0);
  // One digit more would be written only where a shorter candidate sits within 4.5e-16 (relative)
  // of the edge of the rounding interval without being an integer: no value of this sample.
  EXPECT_EQ(longer, 0) << longer << " of " << checked;
}

TEST(FloatToTextTest, EdgeValues) {
  for (const float value :
       {std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::max(), std::nextafter(1.0f, 0.0f), std::nextafter(1.0f, 2.0f),
        16777216.0f, 16777217.0f, 1e-45f, 9.99999944e-39f, 999999.94f, 9999999.0f, 99999992.0f,
        999999940.0f, 1e10f, 1e-5f, 1.0000001e-5f, 0.000123f}) {
    for (const float signed_value : {value, -value}) {
      int failures = 0;
      CheckOne(std::bit_cast<uint32_t>(signed_value), &failures);
      EXPECT_EQ(failures, 0) << signed_value;
    }
  }
  int failures = 0;
  for (int e = -149; e <= 127; ++e)
    CheckOne(std::bit_cast<uint32_t>(std::ldexp(1.0f, e)), &failures);
  for (int e = -45; e <= 38; ++e) {
    const auto power = static_cast<float>(std::pow(10.0, e));
    CheckOne(std::bit_cast<uint32_t>(power), &failures);
    CheckOne(std::bit_cast<uint32_t>(std::nextafter(power, 0.0f)), &failures);
  }
  EXPECT_EQ(failures, 0);
}

TEST(FloatToTextTest, WritesJsonNumbersInFixedOrScientificNotation) {
  EXPECT_EQ(Text(0.1f), "0.1");
  EXPECT_EQ(Text(-2.5f), "-2.5");
  EXPECT_EQ(Text(1.0f), "1");
  EXPECT_EQ(Text(120.0f), "120");
  EXPECT_EQ(Text(123456792.0f), "123456790");
  EXPECT_EQ(Text(0.000123f), "0.000123");
  EXPECT_EQ(Text(1e-5f), "1e-05");
  EXPECT_EQ(Text(1.25e-6f), "1.25e-06");
  EXPECT_EQ(Text(1.5e20f), "1.5e+20");
  EXPECT_EQ(Text(1e9f), "1e+09");
  EXPECT_EQ(Text(std::numeric_limits<float>::max()), "3.4028235e+38");
  EXPECT_EQ(Text(std::numeric_limits<float>::denorm_min()), "1e-45");
  EXPECT_EQ(Text(0.0f), "0");
  EXPECT_EQ(Text(-0.0f), "-0");
  EXPECT_EQ(Text(std::numeric_limits<float>::infinity()), "inf");
  EXPECT_FALSE(IsJsonNumber("01"));
  EXPECT_FALSE(IsJsonNumber("1."));
  EXPECT_FALSE(IsJsonNumber("1e"));
  EXPECT_FALSE(IsJsonNumber("nan"));
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    const float value = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isfinite(value)) continue;
    ASSERT_TRUE(IsJsonNumber(Text(value))) << Text(value);
  }
}

}  // namespace
}  // namespace attnserve
