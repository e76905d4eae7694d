// F16/BF16 conversions, checked against independent definitions: decoding against the formats'
// formulas evaluated with std::ldexp in double, encoding against a brute-force search for the
// nearest representable value.
#include "core/util/half_float.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

constexpr uint16_t kHalfInfinity = 0x7c00;
constexpr uint16_t kBFloat16Infinity = 0x7f80;

uint32_t Bits(float value) { return std::bit_cast<uint32_t>(value); }
float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

// binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
double DecodeHalf(uint16_t bits) {
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// bfloat16: 1 sign bit, 8 exponent bits (bias 127), 7 mantissa bits.
double DecodeBFloat16(uint16_t bits) {
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  const int exponent = (bits >> 7) & 0xff;
  const int mantissa = bits & 0x7f;
  if (exponent == 0xff) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -133);
  return sign * std::ldexp(128 + mantissa, exponent - 134);
}

// The value of every non-negative finite pattern, indexed by the pattern (they increase with
// it), followed at index `infinity` by the power of two just past the largest finite value:
// IEEE 754 rounds to ∞ exactly when that power would be the nearest (ties to even included, as
// the ∞ pattern is even).
std::vector<double> NonNegativeTable(uint16_t infinity,
                                     const std::function<double(uint16_t)>& decode,
                                     double overflow_value) {
  std::vector<double> table;
  for (uint32_t bits = 0; bits < infinity; ++bits) table.push_back(decode(bits));
  table.push_back(overflow_value);
  return table;
}

// Round to nearest, ties to even, by scanning every candidate.
uint16_t NearestByScan(const std::vector<double>& table, float value) {
  const double magnitude = std::fabs(static_cast<double>(value));
  size_t best = 0;
  for (size_t i = 1; i < table.size(); ++i) {
    const double distance = std::fabs(table[i] - magnitude);
    const double best_distance = std::fabs(table[best] - magnitude);
    if (distance < best_distance || (distance == best_distance && (i & 1) == 0)) best = i;
  }
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isinf(value)) return static_cast<uint16_t>(sign | (table.size() - 1));
  return static_cast<uint16_t>(sign | best);
}

const std::vector<double>& HalfTable() {
  static const auto* table =
      new std::vector<double>(NonNegativeTable(kHalfInfinity, DecodeHalf, 65536.0));
  return *table;
}

const std::vector<double>& BFloat16Table() {
  static const auto* table = new std::vector<double>(
      NonNegativeTable(kBFloat16Infinity, DecodeBFloat16, std::ldexp(1.0, 128)));
  return *table;
}

// Floats worth checking for either format: zeros, the extremes of fp32, values around 1 and
// exact ties, plus the caller's format-specific ones.
std::vector<float> CommonEdgeFloats() {
  return {0.0f,
          -0.0f,
          1.0f,
          -1.0f,
          0.1f,
          1.0f / 3.0f,
          3.14159265f,
          std::numeric_limits<float>::min(),
          std::numeric_limits<float>::denorm_min(),
          std::numeric_limits<float>::max(),
          -std::numeric_limits<float>::max(),
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(),
          std::ldexp(1.0f, -20),
          std::ldexp(1.0f, 20),
          1e30f,
          -1e-30f};
}

// Random floats: half of them with arbitrary bit patterns, half with exponents inside
// [min_exponent, max_exponent] where the format's normals, subnormals and overflow live.
std::vector<float> RandomFloats(int count, int min_exponent, int max_exponent, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<int> exponent(min_exponent, max_exponent);
  std::vector<float> values;
  while (static_cast<int>(values.size()) < count) {
    uint32_t bits = any_bits(rng);
    if (values.size() % 2 == 0) {
      bits = (bits & 0x807f'ffffu) | static_cast<uint32_t>(exponent(rng) + 127) << 23;
    }
    if (!std::isnan(FromBits(bits))) values.push_back(FromBits(bits));
  }
  return values;
}

void ExpectNaN(uint16_t bits, uint16_t infinity, bool negative) {
  EXPECT_EQ(bits & infinity, infinity) << std::hex << bits;
  EXPECT_NE(bits & ~infinity & 0x7fff, 0) << std::hex << bits;
  EXPECT_EQ((bits & 0x8000) != 0, negative) << std::hex << bits;
}

TEST(HalfFloatTest, HalfToFloatMatchesTheFormulaForEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto half = static_cast<uint16_t>(bits);
    const float value = HalfToFloat(half);
    const double expected = DecodeHalf(half);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(value)) << std::hex << bits;
      // Sign and payload (quiet bit included) carry over unchanged.
      ASSERT_EQ(Bits(value), (bits & 0x8000u) << 16 | 0x7f80'0000u | (bits & 0x3ffu) << 13)
          << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(value), expected) << std::hex << bits;
      ASSERT_EQ(std::signbit(value), (bits & 0x8000) != 0) << std::hex << bits;
    }
  }
}

TEST(HalfFloatTest, EveryNonNaNHalfRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    if ((bits & 0x7fff) > kHalfInfinity) continue;
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(bits))), bits) << std::hex << bits;
  }
}

TEST(HalfFloatTest, FloatToHalfMatchesBruteForceOnEdgeValues) {
  std::vector<float> values = CommonEdgeFloats();
  const std::vector<float> half_edges = {
      65504.0f,    // Largest binary16.
      65519.996f,  // Just below the tie with 2^16: stays finite.
      65520.0f,    // The tie: rounds to even, which is ∞.
      65536.0f,
      -65520.0f,                     // ∞ and -∞.
      std::ldexp(1.0f, -14),         // Smallest normal.
      std::ldexp(1.0f, -24),         // Smallest subnormal.
      std::ldexp(1.0f, -25),         // Tie between 0 and the smallest subnormal: 0.
      std::ldexp(1.0000001f, -25),   // Just above that tie: the smallest subnormal.
      std::ldexp(3.0f, -25),         // Tie between subnormals 1 and 2: 2.
      std::ldexp(5.0f, -25),         // Tie between subnormals 2 and 3: 2.
      std::ldexp(2047.0f, -25),      // Tie between the largest subnormal and 2^-14.
      std::ldexp(1.0f, -26),         // Well below half a unit: 0.
      1.0f + std::ldexp(1.0f, -11),  // Tie: 1.
      1.0f + std::ldexp(3.0f, -11),  // Tie: 1 + 2^-9.
      2049.0f,
      2051.0f,  // Ties between integers above 2048.
      -2049.0f,
      1.0f + std::ldexp(1.0f, -12)};
  values.insert(values.end(), half_edges.begin(), half_edges.end());
  for (float value : values) {
    EXPECT_EQ(FloatToHalf(value), NearestByScan(HalfTable(), value))
        << value << " (bits " << std::hex << Bits(value) << ")";
  }
}

TEST(HalfFloatTest, FloatToHalfMatchesBruteForceOnRandomValues) {
  for (float value : RandomFloats(4000, -27, 17, 42)) {
    ASSERT_EQ(FloatToHalf(value), NearestByScan(HalfTable(), value))
        << value << " (bits " << std::hex << Bits(value) << ")";
  }
}

TEST(HalfFloatTest, FloatToHalfRoundsEveryMidpointToEven) {
  // The midpoint between consecutive finite halves needs 12 significant bits: exact in fp32.
  for (uint32_t low = 0; low < kHalfInfinity - 1; ++low) {
    const double a = DecodeHalf(static_cast<uint16_t>(low));
    const double b = DecodeHalf(static_cast<uint16_t>(low + 1));
    const auto mid = static_cast<float>((a + b) / 2);
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
    const uint32_t even = (low & 1) == 0 ? low : low + 1;
    ASSERT_EQ(FloatToHalf(mid), even) << std::hex << low;
    ASSERT_EQ(FloatToHalf(-mid), 0x8000 | even) << std::hex << low;
    // One fp32 step either side breaks the tie.
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 0.0f)), low) << std::hex << low;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 1e9f)), low + 1) << std::hex << low;
  }
}

TEST(HalfFloatTest, FloatToHalfKeepsNaN) {
  ExpectNaN(FloatToHalf(std::numeric_limits<float>::quiet_NaN()), kHalfInfinity, false);
  ExpectNaN(FloatToHalf(-std::numeric_limits<float>::quiet_NaN()), kHalfInfinity, true);
  // Signalling NaNs whose payload is only in the bits binary16 drops must not become ∞.
  ExpectNaN(FloatToHalf(FromBits(0x7f80'0001u)), kHalfInfinity, false);
  ExpectNaN(FloatToHalf(FromBits(0xff80'1000u)), kHalfInfinity, true);
  ExpectNaN(FloatToHalf(FromBits(0x7fa0'0000u)), kHalfInfinity, false);
}

TEST(HalfFloatTest, BFloat16ToFloatMatchesTheFormulaForEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto bf16 = static_cast<uint16_t>(bits);
    const float value = BFloat16ToFloat(bf16);
    const double expected = DecodeBFloat16(bf16);
    // bfloat16 is the upper half of an fp32, NaN payloads included.
    ASSERT_EQ(Bits(value), bits << 16) << std::hex << bits;
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(value)) << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(value), expected) << std::hex << bits;
    }
  }
}

TEST(HalfFloatTest, EveryNonNaNBFloat16RoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    if ((bits & 0x7fff) > kBFloat16Infinity) continue;
    ASSERT_EQ(FloatToBFloat16(BFloat16ToFloat(static_cast<uint16_t>(bits))), bits)
        << std::hex << bits;
  }
}

TEST(HalfFloatTest, FloatToBFloat16MatchesBruteForceOnEdgeValues) {
  std::vector<float> values = CommonEdgeFloats();
  const std::vector<float> bf16_edges = {
      1.0f + std::ldexp(1.0f, -8),  // Tie: 1.
      1.0f + std::ldexp(3.0f, -8),  // Tie: 1 + 2^-6.
      1.0f + std::ldexp(1.0f, -9),  // Below the tie: 1.
      FromBits(0x7f7f'8000u),       // Tie between the largest bfloat16 and 2^128: ∞.
      FromBits(0x7f7f'7fffu),       // Just below it: the largest bfloat16.
      FromBits(0x0000'8000u),       // Subnormal tie: 0.
      FromBits(0x0001'8000u),       // Subnormal tie: 2.
      FromBits(0x007f'ffffu),       // Largest fp32 subnormal: rounds up to the min normal.
      FromBits(0x8000'0001u)};      // -denorm_min: -0.
  values.insert(values.end(), bf16_edges.begin(), bf16_edges.end());
  for (float value : values) {
    EXPECT_EQ(FloatToBFloat16(value), NearestByScan(BFloat16Table(), value))
        << value << " (bits " << std::hex << Bits(value) << ")";
  }
}

TEST(HalfFloatTest, FloatToBFloat16MatchesBruteForceOnRandomValues) {
  for (float value : RandomFloats(4000, -140, 127, 7)) {
    ASSERT_EQ(FloatToBFloat16(value), NearestByScan(BFloat16Table(), value))
        << value << " (bits " << std::hex << Bits(value) << ")";
  }
}

TEST(HalfFloatTest, FloatToBFloat16RoundsEveryMidpointToEven) {
  for (uint32_t low = 0; low < kBFloat16Infinity - 1; ++low) {
    // The fp32 pattern halfway between two bfloat16 patterns is exactly their midpoint.
    const float mid = FromBits(low << 16 | 0x8000u);
    const uint32_t even = (low & 1) == 0 ? low : low + 1;
    ASSERT_EQ(FloatToBFloat16(mid), even) << std::hex << low;
    ASSERT_EQ(FloatToBFloat16(-mid), 0x8000 | even) << std::hex << low;
    ASSERT_EQ(FloatToBFloat16(FromBits(low << 16 | 0x7fffu)), low) << std::hex << low;
    ASSERT_EQ(FloatToBFloat16(FromBits(low << 16 | 0x8001u)), low + 1) << std::hex << low;
  }
}

TEST(HalfFloatTest, FloatToBFloat16KeepsNaN) {
  ExpectNaN(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()), kBFloat16Infinity, false);
  ExpectNaN(FloatToBFloat16(-std::numeric_limits<float>::quiet_NaN()), kBFloat16Infinity, true);
  // A payload only in the low half must not truncate to ∞.
  ExpectNaN(FloatToBFloat16(FromBits(0x7f80'0001u)), kBFloat16Infinity, false);
  ExpectNaN(FloatToBFloat16(FromBits(0xff80'ffffu)), kBFloat16Infinity, true);
  // The result is quiet.
  EXPECT_NE(FloatToBFloat16(FromBits(0x7f80'0001u)) & 0x0040, 0);
}

}  // namespace
}  // namespace attnserve
