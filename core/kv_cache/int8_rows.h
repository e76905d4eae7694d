// int8 rows of a KV cache: each token's K (or V) row of one head is stored as head_dim int8 values
// and one scale, value ≈ int8 · scale (symmetric: no zero point, since K and V rows are centred
// near zero). The scale is max|x| / 127 rounded *up* to a bf16, so it is exact as stored, no value
// passes ±127, and each value is within scale / 2 of the original: the same error as an fp32 scale,
// in 2 bytes instead of 4 (a 64-wide head costs 66 bytes per row instead of bf16's 128).
//
// Plain functions on caller-owned arrays; thread-safe.
#ifndef ATTNSERVE_CORE_KV_CACHE_INT8_ROWS_H_
#define ATTNSERVE_CORE_KV_CACHE_INT8_ROWS_H_

#include <algorithm>
#include <bit>
#include <cstdint>

namespace attnserve::core {

// Writes src[0, count) to dst as int8 (round to nearest, ties to even) and returns the
// scale's bf16 bits. An all-zero row gets scale 0. A row holding a NaN or an infinity gets a NaN
// scale and zero values, so that every value of it reads back as NaN (the forward passes report
// non-finite outputs; nothing is silently clamped).
uint16_t QuantizeInt8Row(const float* src, int64_t count, int8_t* dst);

// The scale a bf16 `bits` holds, exactly.
inline float Int8Scale(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// dst[i] = src[i] · Int8Scale(scale) for i < count.
void DequantizeInt8Row(const int8_t* src, uint16_t scale, int64_t count, float* dst);

// How an int8 cache block stores one head's `block_rows` rows of `dim` values, so that the
// integer kernel (int8_dot_kernel.h) reads them with no shuffles: its dot products need, in each
// 32-bit lane of a register, either two columns of one key (sixteen keys to a register) or one
// column of four value rows.
// - Keys, in tiles of 16 rows (a block's last tile holds block_rows % 16 when that is not 0):
//   within a tile of `height` rows, column pair (2j, 2j + 1) of every row, row by row:
//   element (r, i) at tile · 16 · dim + 2j · height + (r % 16) · 2 + i % 2 (a last odd column
//   alone, one byte per row).
// - Values, in groups of 4 rows (the last may hold block_rows % 4): within a group of `height`
//   rows, column i of every row together: element (r, i) at group · 4 · dim + i · height + r % 4.
// Either way a block's rows fill block_rows · dim bytes.
inline constexpr int64_t kInt8KeyTileRows = 16;
inline constexpr int64_t kInt8ValueGroupRows = 4;

// Byte offset of key row r's element i in its block.
inline int64_t Int8KeyOffset(int64_t block_rows, int64_t dim, int64_t r, int64_t i) {
  const int64_t tile = r / kInt8KeyTileRows;
  const int64_t height = std::min(kInt8KeyTileRows, block_rows - tile * kInt8KeyTileRows);
  const int64_t pair = i / 2, width = std::min<int64_t>(2, dim - 2 * pair);
  return tile * kInt8KeyTileRows * dim + 2 * pair * height + (r % kInt8KeyTileRows) * width + i % 2;
}

// Byte offset of value row r's element i in its block.
inline int64_t Int8ValueOffset(int64_t block_rows, int64_t dim, int64_t r, int64_t i) {
  const int64_t group = r / kInt8ValueGroupRows;
  const int64_t height = std::min(kInt8ValueGroupRows, block_rows - group * kInt8ValueGroupRows);
  return group * kInt8ValueGroupRows * dim + i * height + r % kInt8ValueGroupRows;
}

// Row r of a block's keys (or values), `dim` values: written from / read into a plain row.
void StoreInt8KeyRow(const int8_t* row, int64_t block_rows, int64_t dim, int64_t r, int8_t* block);
void LoadInt8KeyRow(const int8_t* block, int64_t block_rows, int64_t dim, int64_t r, int8_t* row);
void StoreInt8ValueRow(const int8_t* row, int64_t block_rows, int64_t dim, int64_t r,
                       int8_t* block);
void LoadInt8ValueRow(const int8_t* block, int64_t block_rows, int64_t dim, int64_t r, int8_t* row);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_INT8_ROWS_H_
