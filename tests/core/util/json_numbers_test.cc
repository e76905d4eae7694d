// json_numbers.h: number arrays read exactly as a general JSON parser would (or left to it), and
// FP32 values written so that they read back bit for bit.
#include "core/util/json_numbers.h"

#include <cstring>
#include <limits>
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

}  // namespace
}  // namespace attnserve
