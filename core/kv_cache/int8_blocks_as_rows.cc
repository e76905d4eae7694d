#include "core/kv_cache/int8_blocks_as_rows.h"

#include <cstdint>
#include <vector>

#include "core/kv_cache/int8_rows.h"

namespace attnserve::core {
namespace {

// Per thread, reused: AttendRow runs once per head and row of every decode step.
struct Int8RowsScratch {
  std::vector<int8_t> rows;
  std::vector<KvSegment> segments;
};
thread_local Int8RowsScratch int8_rows_scratch;

// The copy into `rows` (its segments in `segments`).
RowAttention CopyInt8BlocksAsRows(const RowAttention& a, std::vector<int8_t>& rows,
                                  std::vector<KvSegment>& segments) {
  const int64_t dim = a.head_dim;
  size_t bytes = 0;
  for (const KvSegment& seg : a.segments) {
    if (seg.type == KvElementType::kInt8 && seg.int8_block_rows > 0) bytes += 2 * seg.count * dim;
  }
  if (bytes == 0) return a;
  rows.resize(bytes);
  segments.assign(a.segments.begin(), a.segments.end());
  int8_t* at = rows.data();
  for (KvSegment& seg : segments) {
    if (seg.type != KvElementType::kInt8 || seg.int8_block_rows == 0) continue;
    const auto* k = static_cast<const int8_t*>(seg.k);
    const auto* v = static_cast<const int8_t*>(seg.v);
    for (int64_t r = 0; r < seg.count; ++r) {
      LoadInt8KeyRow(k, seg.int8_block_rows, dim, r, at + r * dim);
      LoadInt8ValueRow(v, seg.int8_block_rows, dim, r, at + (seg.count + r) * dim);
    }
    seg.k = at;
    seg.v = at + seg.count * dim;
    seg.ld = dim;
    seg.int8_block_rows = 0;
    at += 2 * seg.count * dim;
  }
  RowAttention copy = a;
  copy.segments = segments;
  return copy;
}

}  // namespace

RowAttention WithInt8BlocksAsRows(const RowAttention& a) {
  Int8RowsScratch& scratch = int8_rows_scratch;
  return CopyInt8BlocksAsRows(a, scratch.rows, scratch.segments);
}

}  // namespace attnserve::core
