// The wire float formats: exact known encodings (ties, NaN, ∞, subnormals, the largest finite
// values), the byte layout, unaligned buffers and round trips. half_float_test.cc checks the
// scalar conversions exhaustively against brute force.
#include "core/util/float_format.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The 16-bit patterns of `values` encoded in `format`, read back from the bytes.
std::vector<uint16_t> Encode16(const std::vector<float>& values, FloatFormat format) {
  std::string bytes(values.size() * 2, '\0');
  EncodeFloats(values, format, bytes.data());
  std::vector<uint16_t> bits(values.size());
  std::memcpy(bits.data(), bytes.data(), bytes.size());
  return bits;
}

// Not inlined: with the sizes of a call's constant vectors propagated, GCC 12's -Warray-bounds
// wrongly flags DecodeFloats's float32 branch, which a 16-bit `format` never takes.
[[gnu::noinline]] std::vector<float> Decode16(const std::vector<uint16_t>& bits,
                                              FloatFormat format) {
  std::vector<float> values(bits.size());
  DecodeFloats(reinterpret_cast<const char*>(bits.data()), static_cast<int64_t>(bits.size()),
               format, values.data());
  return values;
}

TEST(FloatFormatTest, NamesAndSizes) {
  EXPECT_EQ(FloatFormatBytes(FloatFormat::kFloat32), 4);
  EXPECT_EQ(FloatFormatBytes(FloatFormat::kBFloat16), 2);
  EXPECT_EQ(FloatFormatBytes(FloatFormat::kFloat16), 2);
  for (FloatFormat format :
       {FloatFormat::kFloat32, FloatFormat::kBFloat16, FloatFormat::kFloat16}) {
    EXPECT_EQ(ParseFloatFormat(FloatFormatName(format)), format);
  }
  EXPECT_EQ(ParseFloatFormat("fp16"), FloatFormat::kFloat16);
  EXPECT_EQ(ParseFloatFormat("f32"), FloatFormat::kFloat32);
  EXPECT_EQ(ParseFloatFormat("float16"), std::nullopt);
  EXPECT_EQ(ParseFloatFormat(""), std::nullopt);
}

TEST(FloatFormatTest, Float16KnownEncodings) {
  const std::vector<float> values = {
      0.0f,
      -0.0f,
      1.0f,
      -2.0f,
      0.5f,
      65504.0f,  // Largest finite binary16.
      65519.0f,  // Below the tie with 2^16: 65504.
      65520.0f,  // The tie: to even, which is ∞.
      1e6f,
      kInf,
      -kInf,
      std::ldexp(1.0f, -14),         // Smallest normal.
      std::ldexp(1.0f, -24),         // Smallest subnormal.
      std::ldexp(1.0f, -25),         // Tie between 0 and the smallest subnormal: 0 (even).
      std::ldexp(3.0f, -25),         // Tie between subnormals 1 and 2: 2.
      std::ldexp(1023.0f, -24),      // Largest subnormal.
      1.0f + std::ldexp(1.0f, -11),  // Tie between 1 and 1 + 2^-10: 1.
      1.0f + std::ldexp(3.0f, -11),  // Tie between 1 + 2^-10 and 1 + 2^-9: 1 + 2^-9.
      0.1f,                          // 0x2e66 (0.0999755859375).
  };
  const std::vector<uint16_t> expected = {0x0000, 0x8000, 0x3c00, 0xc000, 0x3800, 0x7bff, 0x7bff,
                                          0x7c00, 0x7c00, 0x7c00, 0xfc00, 0x0400, 0x0001, 0x0000,
                                          0x0002, 0x03ff, 0x3c00, 0x3c02, 0x2e66};
  EXPECT_EQ(Encode16(values, FloatFormat::kFloat16), expected);

  const std::vector<float> decoded =
      Decode16({0x3c00, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x8000, 0x7c00, 0xfc00, 0x3555},
               FloatFormat::kFloat16);
  EXPECT_EQ(decoded[0], 1.0f);
  EXPECT_EQ(decoded[1], 65504.0f);
  EXPECT_EQ(decoded[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(decoded[3], std::ldexp(1023.0f, -24));
  EXPECT_EQ(decoded[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(decoded[5], 0.0f);
  EXPECT_TRUE(std::signbit(decoded[5]));
  EXPECT_EQ(decoded[6], kInf);
  EXPECT_EQ(decoded[7], -kInf);
  EXPECT_EQ(decoded[8], 0.333251953125f);
}

TEST(FloatFormatTest, BFloat16KnownEncodings) {
  const float max_bf16 = std::bit_cast<float>(0x7f7f'0000u);  // 3.3895314e38
  const std::vector<float> values = {
      0.0f,
      -0.0f,
      1.0f,
      -2.0f,
      max_bf16,                            // Largest finite bfloat16.
      std::bit_cast<float>(0x7f7f'7fffu),  // Below the tie with 2^128: stays finite.
      std::bit_cast<float>(0x7f7f'8000u),  // The tie: to even, which is ∞.
      std::numeric_limits<float>::max(),   // Rounds to ∞.
      kInf,
      -kInf,
      std::bit_cast<float>(0x0000'0001u),  // fp32 denorm_min: 0.
      std::bit_cast<float>(0x0001'8000u),  // Subnormal tie between 1 and 2: 2.
      std::bit_cast<float>(0x007f'ffffu),  // Largest fp32 subnormal: the smallest normal.
      1.0f + std::ldexp(1.0f, -8),         // Tie between 1 and 1 + 2^-7: 1.
      1.0f + std::ldexp(3.0f, -8),         // Tie between 1 + 2^-7 and 1 + 2^-6: 1 + 2^-6.
      0.1f,                                // 0x3dcd (0.10009765625).
  };
  const std::vector<uint16_t> expected = {0x0000, 0x8000, 0x3f80, 0xc000, 0x7f7f, 0x7f7f,
                                          0x7f80, 0x7f80, 0x7f80, 0xff80, 0x0000, 0x0002,
                                          0x0080, 0x3f80, 0x3f82, 0x3dcd};
  EXPECT_EQ(Encode16(values, FloatFormat::kBFloat16), expected);

  const std::vector<float> decoded =
      Decode16({0x3f80, 0x7f7f, 0x0001, 0xff80, 0x3dcd}, FloatFormat::kBFloat16);
  EXPECT_EQ(decoded[0], 1.0f);
  EXPECT_EQ(decoded[1], max_bf16);
  EXPECT_EQ(decoded[2], std::bit_cast<float>(0x0001'0000u));  // A subnormal, exactly.
  EXPECT_EQ(decoded[3], -kInf);
  EXPECT_EQ(decoded[4], 0.10009765625f);
}

TEST(FloatFormatTest, NaNStaysNaNInEveryFormat) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  const float signalling_low_payload = std::bit_cast<float>(0x7f80'0001u);  // Not ∞ after rounding.
  for (FloatFormat format : {FloatFormat::kBFloat16, FloatFormat::kFloat16}) {
    SCOPED_TRACE(std::string(FloatFormatName(format)));
    const std::vector<float> back =
        Decode16(Encode16({quiet, -quiet, signalling_low_payload}, format), format);
    for (float value : back) EXPECT_TRUE(std::isnan(value));
    EXPECT_TRUE(std::signbit(back[1]));
  }
}

TEST(FloatFormatTest, Float32IsTheLittleEndianBytes) {
  const std::vector<float> values = {1.0f, -0.0f, kInf, 3.25f};
  std::string bytes(values.size() * 4, '\0');
  EncodeFloats(values, FloatFormat::kFloat32, bytes.data());
  EXPECT_EQ(bytes.substr(0, 4), std::string("\x00\x00\x80\x3f", 4));
  std::vector<float> back(values.size());
  DecodeFloats(bytes.data(), 4, FloatFormat::kFloat32, back.data());
  EXPECT_EQ(back, values);
}

TEST(FloatFormatTest, TwoByteFormatsAreLittleEndian) {
  std::string bytes(2, '\0');
  const float one = 1.0f;
  EncodeFloats({&one, 1}, FloatFormat::kFloat16, bytes.data());
  EXPECT_EQ(bytes, std::string("\x00\x3c", 2));
  EncodeFloats({&one, 1}, FloatFormat::kBFloat16, bytes.data());
  EXPECT_EQ(bytes, std::string("\x80\x3f", 2));
}

// Buffers inside a protobuf string need not be aligned: encode and decode at an odd offset.
TEST(FloatFormatTest, RoundTripsThroughUnalignedBuffersWithinHalfAStep) {
  std::vector<float> values;
  for (int i = 0; i < 1000; ++i) values.push_back(std::sin(0.37f * i) * (1.0f + i % 7));
  for (FloatFormat format :
       {FloatFormat::kFloat32, FloatFormat::kBFloat16, FloatFormat::kFloat16}) {
    SCOPED_TRACE(std::string(FloatFormatName(format)));
    const int64_t size = FloatFormatBytes(format);
    std::string buffer(1 + values.size() * size, '\0');
    EncodeFloats(values, format, buffer.data() + 1);
    std::vector<float> back(values.size());
    DecodeFloats(buffer.data() + 1, static_cast<int64_t>(values.size()), format, back.data());
    // Round to nearest: within half a unit in the last place, at most 2^-8 (bf16, 8 significant
    // bits) or 2^-11 (f16, 11 bits) of |x| for normal values, which these are.
    const float relative = format == FloatFormat::kFloat32    ? 0.0f
                           : format == FloatFormat::kBFloat16 ? std::ldexp(1.0f, -8)
                                                              : std::ldexp(1.0f, -11);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_LE(std::fabs(back[i] - values[i]), relative * std::fabs(values[i])) << i;
    }
    // A second round trip changes nothing: decoded values are representable.
    std::string again(values.size() * size, '\0');
    EncodeFloats(back, format, again.data());
    EXPECT_EQ(again, buffer.substr(1));
  }
}

TEST(FloatFormatTest, EmptyIsFine) {
  for (FloatFormat format :
       {FloatFormat::kFloat32, FloatFormat::kBFloat16, FloatFormat::kFloat16}) {
    EncodeFloats({}, format, nullptr);
    DecodeFloats(nullptr, 0, format, nullptr);
  }
}

}  // namespace
}  // namespace attnserve
