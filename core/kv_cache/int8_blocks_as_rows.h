// WithInt8BlocksAsRows: a RowAttention whose int8 blocks are copied out as plain rows.
//
// In an int8 KV block the rows are tiled for the integer dot-product kernel (int8_rows.h: keys
// sixteen rows to a tile, values four). The row-by-row kernels of paged_attention.cc other than
// the int8 block kernel, and AttendRows' GEMMs, read a segment's rows one after another; for
// them this copies each int8 block segment's rows out, untiled, into scratch of the calling
// thread and returns the attention with those segments in place of the blocks.
//
// Thread-safety: each thread has its own scratch; the returned RowAttention (its segments and
// rows) stays valid until the same thread's next call.
#ifndef ATTNSERVE_CORE_KV_CACHE_INT8_BLOCKS_AS_ROWS_H_
#define ATTNSERVE_CORE_KV_CACHE_INT8_BLOCKS_AS_ROWS_H_

#include "core/kv_cache/paged_attention.h"

namespace attnserve::core {

// `a` with each int8 block segment (int8_block_rows > 0) replaced by its rows, untiled, with
// ld head_dim; `a` itself when it has none. O(rows copied).
RowAttention WithInt8BlocksAsRows(const RowAttention& a);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_INT8_BLOCKS_AS_ROWS_H_
