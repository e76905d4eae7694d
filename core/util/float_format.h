// FloatFormat: how a dense float tensor is laid out as bytes on the wire (attnserve.v1's
// Tensor.raw with its dtype, the Open Inference Protocol's raw contents): little-endian fp32,
// bfloat16 or IEEE binary16, row-major. EncodeFloats / DecodeFloats convert between those bytes
// and fp32 arrays, written once here for the server (server/conversion) and the client library.
//
// Header-only (the client library links no other project code); pure functions, thread-safe.
// The 16-bit formats round to nearest, ties to even, with NaN, ±∞ and subnormals handled as
// half_float.h says.
#ifndef ATTNSERVE_CORE_UTIL_FLOAT_FORMAT_H_
#define ATTNSERVE_CORE_UTIL_FLOAT_FORMAT_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>

#include "core/util/half_float.h"

namespace attnserve {

// The encodings are little-endian; elements are copied with memcpy, so a big-endian host would
// need byte swaps.
static_assert(std::endian::native == std::endian::little);

// The numbers are attnserve.v1's DataType numbers (DATA_TYPE_FP32 = 0, ...), a wire contract:
// FloatFormatNumbered maps a proto's dtype field here, static_cast<v1::DataType> maps back.
enum class FloatFormat {
  kFloat32 = 0,   // 4 bytes, exact.
  kBFloat16 = 1,  // 2 bytes: fp32's range, 8 significant bits (rounding error <= 2^-8 relative).
  kFloat16 = 2,   // 2 bytes: IEEE binary16, 11 significant bits (<= 2^-11), finite up to 65504.
};

// The format numbered `number` (0..2), or nullopt for any other number.
constexpr std::optional<FloatFormat> FloatFormatNumbered(int number) {
  if (number < 0 || number > 2) return std::nullopt;
  return static_cast<FloatFormat>(number);
}

// Bytes per element: 4 or 2.
constexpr int64_t FloatFormatBytes(FloatFormat format) {
  return format == FloatFormat::kFloat32 ? 4 : 2;
}

// "fp32", "bf16" or "f16".
constexpr std::string_view FloatFormatName(FloatFormat format) {
  switch (format) {
    case FloatFormat::kBFloat16:
      return "bf16";
    case FloatFormat::kFloat16:
      return "f16";
    case FloatFormat::kFloat32:
      break;
  }
  return "fp32";
}

// The format named `name` ("fp32", "bf16", "f16"; "f32" and "fp16" also accepted), or nullopt.
inline std::optional<FloatFormat> ParseFloatFormat(std::string_view name) {
  if (name == "fp32" || name == "f32") return FloatFormat::kFloat32;
  if (name == "bf16") return FloatFormat::kBFloat16;
  if (name == "f16" || name == "fp16") return FloatFormat::kFloat16;
  return std::nullopt;
}

// Writes `source` encoded in `format` to `destination`, which must hold
// source.size() * FloatFormatBytes(format) bytes (no alignment needed) and not overlap `source`.
inline void EncodeFloats(std::span<const float> source, FloatFormat format, char* destination) {
  if (source.empty()) return;  // memcpy may not be given the null pointers of empty buffers.
  switch (format) {
    case FloatFormat::kFloat32:
      std::memcpy(destination, source.data(), source.size_bytes());
      return;
    case FloatFormat::kBFloat16:
      for (size_t i = 0; i < source.size(); ++i) {
        const uint16_t bits = FloatToBFloat16(source[i]);
        std::memcpy(destination + 2 * i, &bits, 2);
      }
      return;
    case FloatFormat::kFloat16:
      for (size_t i = 0; i < source.size(); ++i) {
        const uint16_t bits = FloatToHalf(source[i]);
        std::memcpy(destination + 2 * i, &bits, 2);
      }
      return;
  }
}

// Reads `count` elements encoded in `format` from `source` (count * FloatFormatBytes(format)
// bytes, no alignment needed) into `destination`, exactly (every 16-bit value has an fp32 equal).
inline void DecodeFloats(const char* source, int64_t count, FloatFormat format,
                         float* destination) {
  if (count <= 0) return;
  switch (format) {
    case FloatFormat::kFloat32:
      std::memcpy(destination, source, static_cast<size_t>(count) * sizeof(float));
      return;
    case FloatFormat::kBFloat16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + 2 * i, 2);
        destination[i] = BFloat16ToFloat(bits);
      }
      return;
    case FloatFormat::kFloat16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + 2 * i, 2);
        destination[i] = HalfToFloat(bits);
      }
      return;
  }
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_FLOAT_FORMAT_H_
