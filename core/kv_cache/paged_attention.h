// The attention kernel of incremental decoding: one query row of one head against keys that may
// be spread over the blocks of a paged KV cache (kv_block_pool.h) or sit in a projection buffer.
// AttendRow is plain C++ on GCC vector types, compiled once per ISA level: for T = 1 a step is a
// GEMV per head, bound by reading K and V, where oneDNN's matmul setup per block would dominate.
// For head widths 32, 64 and 128 the query and the output row stay in registers, four keys'
// dot products share one reduction, bf16 rows are widened two elements per 32-bit lane, and an
// int8 cache's blocks are read in their layout (int8_rows.h), sixteen keys' dot products at once,
// each row's scale applied once (to the dot product, or to the probability that weighs the value
// row). On CPUs with AVX-512 VNNI an all-int8 row's dot products are integer arithmetic instead
// (int8_dot_kernel.h).
// AttendRows (attend_rows.cc), for T > 1 rows of one sequence (a prefill chunk), gathers the keys
// once and runs Q·Kᵀ and P·V as two dnnl_sgemm calls (compute-bound there: ~10x AttendRow per
// row).
//
// Pure functions on caller-owned memory; thread-safe.
#ifndef ATTNSERVE_CORE_KV_CACHE_PAGED_ATTENTION_H_
#define ATTNSERVE_CORE_KV_CACHE_PAGED_ATTENTION_H_

#include <cstdint>
#include <span>

#include "core/kv_cache/kv_element_type.h"

namespace attnserve::core {

// `count` consecutive keys of one head: key r's K row at k + r·ld, its V row at v + r·ld (ld in
// elements), each head_dim elements of `type`: float, bf16 (uint16_t) rows of a bf16 cache,
// widened exactly to fp32 as they are read, or int8 rows, key r's K row times
// Int8Scale(k_scale[r]) and its V row times Int8Scale(v_scale[r]) (int8_rows.h). Segments of
// different types may be mixed in one row.
struct KvSegment {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t count = 0;
  int64_t ld = 0;
  KvElementType type = KvElementType::kFloat32;
  // kInt8 only: `count` bf16 scales each.
  const uint16_t* k_scale = nullptr;
  const uint16_t* v_scale = nullptr;
  // kInt8 only: 0 for rows as above; otherwise k and v are an int8 cache block of this many rows
  // (≥ count) in the block layout of int8_rows.h (Int8KeyOffset, Int8ValueOffset), and ld is
  // head_dim.
  int64_t int8_block_rows = 0;
};

// Where AttendRow's prefetches bring the rows it is about to read.
enum class PrefetchTarget {
  kL1,  // The rows are likely in the L3: L1 prefetches hide its latency best.
  // The rows likely come from DRAM: L2 prefetches keep more misses in flight than the L1's few
  // miss buffers allow.
  kL2,
};

// kL2 when the K and V one forward reads (`kv_bytes`) exceed the L3 cache, so that with the rest
// of the step's data they cannot stay there between steps; kL1 otherwise. Thread-safe.
PrefetchTarget PrefetchTargetFor(int64_t kv_bytes);

// What one AttendRow call attends.
struct RowAttention {
  std::span<const KvSegment> segments;  // In key order; their counts sum to `keys`.
  int64_t keys = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;  // Multiplies q·k (1/√d_k).
  // Keys >= visible_limit are blocked (the causal limit; `keys` for none).
  int64_t visible_limit = 0;
  // Null, or `keys` bytes: 0 blocks the key.
  const uint8_t* explicit_row = nullptr;
  // Where the rows are prefetched to: the forward's choice from PrefetchTargetFor. Any value gives
  // the same result.
  PrefetchTarget prefetch = PrefetchTarget::kL1;
  // Whether a row whose segments are all int8 may take the integer dot-product kernel
  // (int8_dot_kernel.h) on CPUs that have it. false keeps the fp32-widening kernel, which
  // tests compare it with.
  bool int8_dot = true;
};

// out[head_dim] = softmax(scale · q·Kᵀ, blocked keys -∞) · V, with q, the scores, the softmax and
// the accumulation in fp32 whatever the segments' type. `probabilities` (≥ keys floats)
// receives the softmax, 0 for blocked keys. A row whose keys are all blocked gets all-zero
// probabilities and a zero output, never NaN.
void AttendRow(const RowAttention& a, const float* q, float* probabilities, float* out);

// Scratch of one AttendRows call: k and v hold ≥ keys · head_dim floats each.
struct RowsScratch {
  float* k = nullptr;
  float* v = nullptr;
};

// `rows` query rows attending the same keys, with exactly AttendRow's result per row (up to fp32
// summation order): row j is AttendRow with visible_limit = a.visible_limit + j · limit_step,
// explicit_row = a.explicit_row + j · keys (when non-null), q + j · q_ld, probabilities + j · keys,
// out + j · out_ld. `probabilities` (≥ rows · keys floats) is written even when the caller does
// not want the weights. The GEMMs use oneDNN's threading (single-threaded inside an OpenMP
// parallel region). Returns false (outputs unspecified) only if dnnl_sgemm fails.
bool AttendRows(const RowAttention& a, int64_t rows, int64_t limit_step, const float* q,
                int64_t q_ld, float* probabilities, float* out, int64_t out_ld,
                RowsScratch scratch);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_PAGED_ATTENTION_H_
