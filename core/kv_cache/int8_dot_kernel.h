// AttendRow (paged_attention.h) for a row whose keys and values are all int8 (an int8 KV cache's
// decode step), on x86 CPUs with AVX-512 BW and VNNI (Ice Lake, Sapphire Rapids, Zen 4 and later).
// Widening int8 to fp32 costs more instructions per value than the bf16 kernel spends, so an int8
// cache read half the bytes of a bf16 one but decoded no faster where the rows sit in cache. Here
// the query is rounded to int16 once per row and the keys' dot products are exact integer
// arithmetic, sixteen keys to a register (vpdpwssd); the values are weighed sixteen rows at a
// time with their weights (probability times the row's scale) rounded to 8 bits, as exact integer
// dot products of four rows per instruction (vpdpbusd), 64 products each. Both read the cache's
// int8 blocks in the layout int8_rows.h gives them for this, with no shuffles.
//
// The approximations beyond the cache's own: the query's rounding to int16, at most 2^-16 of its
// largest |element| per element; each weight's rounding, at most half a step of 1/255 of the
// largest weight among its sixteen rows (a block's rows 16j to 16j + 15). Same semantics as
// AttendRow otherwise (blocked keys, fully blocked rows, rows with non-finite scores).
//
// Pure functions on caller-owned memory; thread-safe.
#ifndef ATTNSERVE_CORE_KV_CACHE_INT8_DOT_KERNEL_H_
#define ATTNSERVE_CORE_KV_CACHE_INT8_DOT_KERNEL_H_

#include "core/kv_cache/paged_attention.h"

namespace attnserve::core {

// Whether this CPU has what AttendRowInt8Dot needs (AVX-512 F, BW, VL and VNNI). Read once.
bool HasInt8DotKernel();

// Computes AttendRow(a, q, probabilities, out) and returns true when it applies: the CPU has the
// instructions, head_dim is 64 or 128, every segment is an int8 cache block of a multiple of 16
// rows (KvSegment::int8_block_rows), and q is finite with its largest |element| zero or normal.
// Otherwise returns false having written nothing (the caller runs the portable kernel).
bool AttendRowInt8Dot(const RowAttention& a, const float* q, float* probabilities, float* out);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_INT8_DOT_KERNEL_H_
