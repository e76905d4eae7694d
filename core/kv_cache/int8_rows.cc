#include "core/kv_cache/int8_rows.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/util/per_isa_clones.h"

namespace attnserve::core {
namespace {

constexpr uint16_t kNanScale = 0x7fc0;

// The bf16 bits of the smallest bf16 >= `x` (x > 0 and finite).
uint16_t RoundUpToBf16(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0xffffu) != 0) bits = (bits & 0xffff0000u) + 0x10000u;  // Positive: up = away from 0.
  return static_cast<uint16_t>(bits >> 16);
}

// Per ISA level: the max and the scaling loop vectorise (a token's rows are written once per step).
ATTNSERVE_PER_ISA_CLONES uint16_t QuantizeInt8RowClones(const float* src, int64_t count,
                                                        int8_t* dst) {
  float max_abs = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < count; ++i) {
    max_abs = std::max(max_abs, std::fabs(src[i]));
    finite &= std::isfinite(src[i]);
  }
  if (!finite || max_abs == 0.0f) {
    std::fill(dst, dst + count, int8_t{0});
    return finite ? uint16_t{0} : kNanScale;
  }
  const uint16_t scale = RoundUpToBf16(max_abs / 127.0f);
  const float inverse = 1.0f / Int8Scale(scale);
  for (int64_t i = 0; i < count; ++i) {
    // |src[i] · inverse| <= 127 up to one rounding of the product: the clamp only catches that.
    const float q = std::clamp(std::nearbyint(src[i] * inverse), -127.0f, 127.0f);
    dst[i] = static_cast<int8_t>(q);
  }
  return scale;
}

ATTNSERVE_PER_ISA_CLONES void DequantizeInt8RowClones(const int8_t* src, uint16_t scale,
                                                      int64_t count, float* dst) {
  const float s = Int8Scale(scale);
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]) * s;
}

}  // namespace

uint16_t QuantizeInt8Row(const float* src, int64_t count, int8_t* dst) {
  return QuantizeInt8RowClones(src, count, dst);
}

void DequantizeInt8Row(const int8_t* src, uint16_t scale, int64_t count, float* dst) {
  DequantizeInt8RowClones(src, scale, count, dst);
}

// A row at a time (a decode step writes one row per head): strided copies, the layout's
// arithmetic done once per row. Int8KeyOffset / Int8ValueOffset define what these compute.
namespace {

// Where key row r's first column pair starts, and the stride between its pairs.
struct KeyRowPlace {
  int64_t start, pair_stride, last_odd;  // last_odd: offset of an odd dim's last column, or -1.
};

KeyRowPlace KeyRowPlaceOf(int64_t block_rows, int64_t dim, int64_t r) {
  const int64_t tile = r / kInt8KeyTileRows, row = r % kInt8KeyTileRows;
  const int64_t height = std::min(kInt8KeyTileRows, block_rows - tile * kInt8KeyTileRows);
  const int64_t tile_start = tile * kInt8KeyTileRows * dim;
  return {.start = tile_start + 2 * row,
          .pair_stride = 2 * height,
          .last_odd = dim % 2 == 1 ? tile_start + (dim - 1) * height + row : -1};
}

// Where value row r's first column sits, and the stride between its columns.
std::pair<int64_t, int64_t> ValueRowPlaceOf(int64_t block_rows, int64_t dim, int64_t r) {
  const int64_t group = r / kInt8ValueGroupRows;
  const int64_t height = std::min(kInt8ValueGroupRows, block_rows - group * kInt8ValueGroupRows);
  return {group * kInt8ValueGroupRows * dim + r % kInt8ValueGroupRows, height};
}

}  // namespace

void StoreInt8KeyRow(const int8_t* row, int64_t block_rows, int64_t dim, int64_t r, int8_t* block) {
  const KeyRowPlace place = KeyRowPlaceOf(block_rows, dim, r);
  int8_t* at = block + place.start;
  for (int64_t i = 0; i + 1 < dim; i += 2, at += place.pair_stride) {
    at[0] = row[i];
    at[1] = row[i + 1];
  }
  if (place.last_odd >= 0) block[place.last_odd] = row[dim - 1];
}

void LoadInt8KeyRow(const int8_t* block, int64_t block_rows, int64_t dim, int64_t r, int8_t* row) {
  const KeyRowPlace place = KeyRowPlaceOf(block_rows, dim, r);
  const int8_t* at = block + place.start;
  for (int64_t i = 0; i + 1 < dim; i += 2, at += place.pair_stride) {
    row[i] = at[0];
    row[i + 1] = at[1];
  }
  if (place.last_odd >= 0) row[dim - 1] = block[place.last_odd];
}

void StoreInt8ValueRow(const int8_t* row, int64_t block_rows, int64_t dim, int64_t r,
                       int8_t* block) {
  const auto [start, stride] = ValueRowPlaceOf(block_rows, dim, r);
  for (int64_t i = 0; i < dim; ++i) block[start + i * stride] = row[i];
}

void LoadInt8ValueRow(const int8_t* block, int64_t block_rows, int64_t dim, int64_t r,
                      int8_t* row) {
  const auto [start, stride] = ValueRowPlaceOf(block_rows, dim, r);
  for (int64_t i = 0; i < dim; ++i) row[i] = block[start + i * stride];
}

}  // namespace attnserve::core
