// bf16 conversion against a reference that picks the nearer of a float's two bf16 neighbours in
// double precision (ties to even), at every length and alignment the vectorised loops split into.
#include "core/forward/bf16_conversion.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

// The magnitude bf16 `bits` (top 16 bits of an fp32) stand for, with the infinity taken as 2^128,
// where the exponent would go next: IEEE rounds to it what lies at least half an ulp past the max.
double Magnitude(uint32_t bits) {
  const float value = std::fabs(std::bit_cast<float>(bits));
  return std::isinf(value) ? std::ldexp(1.0, 128) : value;
}

// The bf16 nearest to finite `x`, by comparing the distances to both neighbours.
uint16_t NearestBf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t toward_zero = bits & 0xffff0000u;
  const uint32_t away = toward_zero + 0x10000u;  // Next magnitude up (may be the infinity).
  const double magnitude = std::fabs(static_cast<double>(x));
  const double below = magnitude - Magnitude(toward_zero);
  const double above = Magnitude(away) - magnitude;
  uint32_t pick = below < above ? toward_zero : away;
  if (below == above) pick = (toward_zero & 0x10000u) == 0 ? toward_zero : away;
  return static_cast<uint16_t>(pick >> 16);
}

// Random finite floats over the whole exponent range, with exact ties and values next to them.
std::vector<float> Values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> values(n);
  for (float& v : values) {
    uint32_t bits = static_cast<uint32_t>(rng());
    if ((bits & 0x7f800000u) == 0x7f800000u) bits &= 0xbfffffffu;  // No NaN or infinity.
    // Three in four get low halves at a tie, just below one and just above one; the rest stay.
    constexpr uint32_t kLowHalves[] = {0x8000u, 0x7fffu, 0x8001u};
    if (const uint64_t pick = rng() % 4; pick < 3) bits = (bits & 0xffff0000u) | kLowHalves[pick];
    v = std::bit_cast<float>(bits);
  }
  return values;
}

TEST(Bf16ConversionTest, RoundsToNearestTiesToEvenAtEveryLengthAndOffset) {
  const std::vector<float> values = Values(4096, 7);
  for (int64_t offset : {0, 1, 3}) {
    for (int64_t count = 0; count <= 70; ++count) {
      const float* src = values.data() + offset + count * 40;
      std::vector<uint16_t> out(count + 1, 0xabcd);
      RoundToBf16(src, count, out.data());
      std::vector<float> in_place(src, src + count);
      RoundToBf16InPlace(in_place.data(), count);
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t expected = NearestBf16(src[i]);
        ASSERT_EQ(out[i], expected) << "value " << src[i] << ", count " << count;
        ASSERT_EQ(std::bit_cast<uint32_t>(in_place[i]), uint32_t{expected} << 16)
            << "value " << src[i] << ", count " << count;
      }
      EXPECT_EQ(out[count], 0xabcd) << "wrote past count " << count;
    }
  }
}

TEST(Bf16ConversionTest, EdgeValues) {
  const float max = std::numeric_limits<float>::max();
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               max,
                               -max};
  std::vector<uint16_t> out(values.size());
  RoundToBf16(values.data(), static_cast<int64_t>(values.size()), out.data());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(out[i], NearestBf16(values[i])) << i;
  EXPECT_EQ(out[1], 0x8000);  // -0 keeps its sign.
  EXPECT_EQ(out[6], 0x7f80);  // fp32's max is nearer bf16's +infinity than its max.
}

TEST(Bf16ConversionTest, WidensExactly) {
  std::vector<uint16_t> bf16(67);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<uint16_t>(i * 977 + 0x3f00);
  for (int64_t count = 0; count <= 67; ++count) {
    std::vector<float> out(count + 1, 5.0f);
    WidenBf16(bf16.data(), count, out.data());
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), uint32_t{bf16[i]} << 16) << i;
    }
    EXPECT_EQ(out[count], 5.0f);
  }
}

}  // namespace
}  // namespace attnserve::core
