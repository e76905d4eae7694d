// json_numbers.h: number arrays read exactly as a general JSON parser would (or left to it), and
// FP32 values written so that they read back bit for bit.
#include "core/util/json_numbers.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

using ::testing::ElementsAre;

std::vector<double> Read(const std::string& text, size_t* length) {
  std::vector<double> values = {42.0};  // What was there before stays.
  *length = ParseJsonNumberArray(text, 4, &values);
  return values;
}

TEST(JsonNumbersTest, ReadsFlatAndNestedArraysOfNumbers) {
  size_t length = 0;
  EXPECT_THAT(Read("[1, -2.5e3,0.125 ,\n 0]", &length), ElementsAre(42, 1, -2500, 0.125, 0));
  EXPECT_EQ(length, 22u);
  EXPECT_THAT(Read("[[1,2],[3,[4]]], \"x\"", &length), ElementsAre(42, 1, 2, 3, 4));
  EXPECT_EQ(length, 15u);
  EXPECT_THAT(Read("[]", &length), ElementsAre(42));
  EXPECT_EQ(length, 2u);
  // Correctly rounded to double, as strtod: the nearest double to 0.1.
  EXPECT_THAT(Read("[0.1]", &length), ElementsAre(42, 0.1));
}

TEST(JsonNumbersTest, LeavesAnythingButStrictJsonNumbersToTheGeneralParser) {
  for (const char* text :
       {"[1, true]", "[1, \"2\"]", "[null]", "[{}]", "[1,]", "[,1]", "[1 2]", "[01]", "[+1]",
        "[.5]", "[1.]", "[1e]", "[NaN]", "[Infinity]", "[1e39]", "[1", "[[[[[1]]]]]", "[1]]"}) {
    size_t length = 0;
    const std::vector<double> values = Read(text, &length);
    if (std::string(text) == "[1]]") {
      EXPECT_EQ(length, 3u);  // The array ends at its own bracket; the rest is the caller's.
      continue;
    }
    EXPECT_EQ(length, 0u) << text;
    EXPECT_THAT(values, ElementsAre(42)) << text;
  }
}

TEST(JsonNumbersTest, ExtractsTheArraysOfAKeyOutsideStrings) {
  std::vector<std::vector<double>> arrays;
  const std::string reduced = ExtractJsonNumberArrays(
      R"({"id": "\"data\": [9]", "inputs": [{"data": [1, 2]}, {"data": [true]}, {"data" : [[3]]}],)"
      R"( "data": 5})",
      "data", "#", 4, &arrays);
  EXPECT_EQ(reduced, R"({"id": "\"data\": [9]", "inputs": [{"data": {"#":0}}, {"data": [true]}, )"
                     R"({"data" : {"#":1}}], "data": 5})");
  ASSERT_EQ(arrays.size(), 2u);
  EXPECT_THAT(arrays[0], ElementsAre(1, 2));
  EXPECT_THAT(arrays[1], ElementsAre(3));
}

TEST(JsonNumbersTest, WrittenFloatsReadBackBitForBit) {
  const std::vector<float> values = {0.0f,
                                     -0.0f,
                                     0.1f,
                                     -1.0f / 3.0f,
                                     std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::max(),
                                     16777216.0f};
  std::string text;
  AppendJsonFloats(values, &text);
  EXPECT_EQ(text, "[0,-0.0,0.1,-0.33333334,1e-45,3.4028235e+38,16777216]");
  std::vector<double> back;
  ASSERT_EQ(ParseJsonNumberArray(text, 1, &back), text.size());
  ASSERT_EQ(back.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const float value = static_cast<float>(back[i]);
    EXPECT_EQ(std::memcmp(&value, &values[i], sizeof(float)), 0) << i;
  }
}

// A number ends at the first byte that is not part of it, wherever it falls in a run of eight.
TEST(JsonNumbersTest, NumbersEndAtTheFirstOtherByte) {
  for (const char after : {'/', ':', ',', ']', ' ', 'x', '\x80'}) {
    for (int n = 1; n <= 12; ++n) {
      const std::string number = "0." + std::string(n, '7');
      const std::string text = number + after + "1234567890";
      double value = 0;
      EXPECT_EQ(json_numbers_internal::ReadNumber(text.data(), text.data() + text.size(), &value),
                number.size())
          << text;
      EXPECT_EQ(value, std::stod(number)) << text;
    }
  }
}

// The fast path must read every number exactly as std::from_chars (correct rounding) does.
TEST(JsonNumbersTest, ReadsEveryNumberAsFromCharsDoes) {
  std::mt19937_64 random(7);
  std::vector<std::string> texts = {"0",
                                    "-0",
                                    "0.0",
                                    "-0.0",
                                    "1",
                                    "9007199254740993",
                                    "9007199254740992",
                                    "123456789012345678901",
                                    "1e22",
                                    "1e23",
                                    "1e-22",
                                    "1e-23",
                                    "4.9e-324",
                                    "2.2250738585072014e-308",
                                    "1.7976931348623157e308",
                                    "0.1",
                                    "0.30000000000000004",
                                    "1E+2",
                                    "1e-0",
                                    "100000000000000000000000000000e-30"};
  // Runs of 1 to 24 digits in the integer part, the fraction or both (eight are read at once while
  // the mantissa has room for them), with leading zeros, and right at the end of the text.
  for (const std::string digits :
       {"123456789012345678901234", "999999999999999999999999", "000000000000000000000001"}) {
    for (size_t n = 1; n <= digits.size(); ++n) {
      const std::string run = digits.substr(0, n);
      for (const std::string& text :
           {run, "0." + run, "-" + run + "." + run, "1." + run + "e-7", run + "e5"}) {
        if (text.size() > 1 && text[0] == '0' && text[1] != '.') continue;  // Not JSON.
        if (text.size() > 2 && text[0] == '-' && text[1] == '0' && text[2] != '.') continue;
        texts.push_back(text);
      }
    }
  }
  std::uniform_int_distribution<uint32_t> bits32;
  std::uniform_int_distribution<uint64_t> bits64;
  for (int i = 0; i < 200000; ++i) {
    char text[64];
    if (i % 2 == 0) {
      const uint32_t word = bits32(random);
      float value;
      std::memcpy(&value, &word, sizeof(value));
      if (!std::isfinite(value)) continue;
      texts.emplace_back(text, std::to_chars(text, text + sizeof(text), value).ptr);
    } else {
      const uint64_t word = bits64(random);
      double value;
      std::memcpy(&value, &word, sizeof(value));
      if (!std::isfinite(value)) continue;
      texts.emplace_back(text, std::to_chars(text, text + sizeof(text), value).ptr);
    }
  }
  for (const std::string& text : texts) {
    double fast = 0;
    double reference = 0;
    ASSERT_EQ(json_numbers_internal::ReadNumber(text.data(), text.data() + text.size(), &fast),
              text.size())
        << text;
    ASSERT_EQ(std::from_chars(text.data(), text.data() + text.size(), reference).ec, std::errc())
        << text;
    ASSERT_EQ(std::memcmp(&fast, &reference, sizeof(double)), 0)
        << text << ": " << fast << " vs " << reference;
  }
}

}  // namespace
}  // namespace attnserve
