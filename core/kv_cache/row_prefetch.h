// Internal to the paged decode kernels (paged_attention.cc, int8_dot_kernel.cc): software
// prefetches of a segment's first rows. A paged row's keys sit in blocks of a few KB scattered
// over the pool: the hardware prefetcher restarts at every block, and without these the kernel
// stalls on the first lines of each block (two thirds of its cycles at 128 cached tokens).
//
// Pure functions; thread-safe. Include only from the kernels' .cc files.
#ifndef ATTNSERVE_CORE_KV_CACHE_ROW_PREFETCH_H_
#define ATTNSERVE_CORE_KV_CACHE_ROW_PREFETCH_H_

#include <algorithm>
#include <cstdint>

#include "core/kv_cache/kv_element_type.h"
#include "core/kv_cache/paged_attention.h"

namespace attnserve::core::row_prefetch {

// Asks for the first rows of a segment's K (or V) at `rows` to be brought into the cache: at most
// kPrefetchRows rows, since past them a long segment is one stream the hardware prefetcher
// follows, and asking for all of it at once would evict the rows in use.
template <int kLocality>
[[gnu::always_inline]] inline void PrefetchRowsTo(const void* rows, const KvSegment& seg,
                                                  int64_t head_dim) {
  constexpr int64_t kLine = 64, kPrefetchRows = 32;
  const auto* base = static_cast<const char*>(rows);
  const int64_t row_bytes = head_dim * ElementBytes(seg.type);
  const int64_t ld_bytes = seg.ld * ElementBytes(seg.type);
  // An int8 block's first rows are spread over its whole tile (int8_rows.h).
  const int64_t rows_read = seg.int8_block_rows > 0 ? seg.int8_block_rows : seg.count;
  for (int64_t r = 0; r < std::min(rows_read, kPrefetchRows); ++r) {
    for (int64_t b = 0; b < row_bytes; b += kLine) {
      __builtin_prefetch(base + r * ld_bytes + b, 0, kLocality);
    }
  }
}

// Locality 3 is prefetcht0 (into L1), 2 is prefetcht1 (into L2). An int8 segment's scales (one
// line for a block of 16 keys) are asked for with its rows; `rows` is seg.k or seg.v.
[[gnu::always_inline]] inline void PrefetchRows(const void* rows, const KvSegment& seg,
                                                int64_t head_dim, PrefetchTarget target) {
  const uint16_t* scales = rows == seg.k ? seg.k_scale : seg.v_scale;
  if (target == PrefetchTarget::kL2) {
    if (scales != nullptr) __builtin_prefetch(scales, 0, 2);
    return PrefetchRowsTo<2>(rows, seg, head_dim);
  }
  // An int8 block's rows of one head are 1-2 KB: from the L3 the hardware brings them in time,
  // and the prefetches only cost issue slots (the integer kernel ran 1.2-1.3x faster without).
  if (seg.int8_block_rows > 0) return;
  if (scales != nullptr) __builtin_prefetch(scales, 0, 3);
  PrefetchRowsTo<3>(rows, seg, head_dim);
}

}  // namespace attnserve::core::row_prefetch

#endif  // ATTNSERVE_CORE_KV_CACHE_ROW_PREFETCH_H_
