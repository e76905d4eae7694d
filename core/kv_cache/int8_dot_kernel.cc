#include "core/kv_cache/int8_dot_kernel.h"

// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(), a self-initialised
// variable that -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593, fixed in
// GCC 13); the warning says nothing about this file's code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/kv_cache/int8_rows.h"
#include "core/kv_cache/row_prefetch.h"
#include "core/kv_cache/row_softmax.h"

namespace attnserve::core {

// The kernel is compiled for this target alone; the project builds for baseline x86-64, so every
// function that uses the intrinsics carries it (the shared helpers are always inlined into them).
// ThreadSanitizer builds and non-x86 compilers get the portable kernel only.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define ATTNSERVE_INT8_DOT 1
#define ATTNSERVE_INT8_DOT_TARGET \
  [[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")]]
#endif

#if defined(ATTNSERVE_INT8_DOT)
namespace {

using row_prefetch::PrefetchRows;
using row_softmax::MaskAndMax;
using row_softmax::SoftmaxRowOrAnswer;

constexpr int64_t kQueryMax = 32767;  // The int16 query's largest |element|.
// Segments prefetched ahead, as the portable kernel does (4 and 8 measured no faster).
constexpr int64_t kAhead = 2;

// The query rounded to int16, as consecutive pairs of elements: q_pairs[j] holds q16[2j] in its
// low half and q16[2j + 1] in its high half, q[i] ≈ q16[i] · scale. False for a non-finite query
// (whose scores are all NaN) and one whose largest |element| is subnormal: the portable kernel
// answers those.
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline bool QuantizeQuery(const float* q, int32_t* q_pairs,
                                                    float& scale) {
  __m512 max_abs = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t c = 0; c < kDim / 16; ++c) {
    const __m512 x = _mm512_loadu_ps(q + 16 * c);
    bad |= _mm512_fpclass_ps_mask(x, 0x99);  // QNaN, SNaN, +∞, -∞.
    max_abs = _mm512_max_ps(max_abs, _mm512_abs_ps(x));
  }
  if (bad != 0) return false;
  const float max = _mm512_reduce_max_ps(max_abs);
  const float inverse_max = max == 0.0f ? 0.0f : static_cast<float>(kQueryMax) / max;
  if (!std::isfinite(inverse_max)) return false;  // Only subnormal elements: too small to scale.
  scale = max / static_cast<float>(kQueryMax);
  const __m512 inverse = _mm512_set1_ps(inverse_max);
  for (int64_t c = 0; c < kDim / 32; ++c) {
    // Rounded to nearest (MXCSR's default); the saturating narrowing only guards the last ulp.
    const __m512i low = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + 32 * c), inverse));
    const __m512i high =
        _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + 32 * c + 16), inverse));
    _mm512_storeu_si512(q_pairs + 16 * c,
                        _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi32_epi16(low)),
                                           _mm512_cvtsepi32_epi16(high), 1));
  }
  return true;
}

// The first `n` (≤ 16) lanes.
inline __mmask16 FirstLanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1);
}

// Sixteen bf16 scales as floats, lanes outside `lanes` 0 (and not read).
ATTNSERVE_INT8_DOT_TARGET inline __m512 Scales16(const uint16_t* bits, __mmask16 lanes) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, bits)), 16));
}

// Scores of keys [key, key + n) of `seg`, an int8 cache block, then the mask and the maximum.
// Sixteen keys at a time: a key tile holds each column pair of its sixteen rows in one 32-byte
// run (int8_rows.h), which sign-extends into one register whose lane r is key r's pair, so the
// tile's sixteen dot products accumulate lane by lane (vpdpwssd against the query's pair) with
// no reduction across lanes (exact: |sum| < 32767 · 127 · 128 < 2^31). A block's last keys past
// `n` are read but not stored. Without an explicit mask the maximum is taken lane by lane in
// `max_lanes` as the scores are made: reading them back from memory right after the masked store
// waits for the store (masked stores do not forward), ~20 % of the kernel's time.
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline void ScoreSegment(const RowAttention& a, const KvSegment& seg,
                                                   int64_t n, int64_t key, const int32_t* q_pairs,
                                                   float q_scale, float* scores, __m512& max_lanes,
                                                   float& max_score, int64_t& open_keys) {
  const auto* k = static_cast<const int8_t*>(seg.k);
  const __m512 scale = _mm512_set1_ps(a.scale * q_scale);
  for (int64_t t = 0; t < n; t += kInt8KeyTileRows) {
    const int8_t* tile = k + t * kDim;
    const __mmask16 rows = FirstLanes(n - t);
    // Four chains: each vpdpwssd waits for the previous one of its chain. Unrolled, so that the
    // chains stay in registers.
    __m512i sums[4];
    for (__m512i& x : sums) x = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int64_t j = 0; j < kDim / 2; j += 4) {
#pragma GCC unroll 4
      for (int64_t u = 0; u < 4; ++u) {
        const __m512i pairs = _mm512_cvtepi8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32 * (j + u))));
        sums[u] = _mm512_dpwssd_epi32(sums[u], pairs, _mm512_set1_epi32(q_pairs[j + u]));
      }
    }
    const __m512i sum =
        _mm512_add_epi32(_mm512_add_epi32(sums[0], sums[1]), _mm512_add_epi32(sums[2], sums[3]));
    const __m512 s = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), scale),
                                   Scales16(seg.k_scale + t, rows));
    _mm512_mask_storeu_ps(scores + key + t, rows, s);
    // max(s, m) is m where s is NaN, as MaskAndMax's std::max(m, s).
    max_lanes = _mm512_mask_max_ps(max_lanes, rows, s, max_lanes);
  }
  if (a.explicit_row != nullptr) {
    MaskAndMax(a.explicit_row, key, n, scores, max_score, open_keys);
  } else {
    open_keys += n;
  }
}

// acc += Σ p[r] · scale_r · V row r over rows [0, n) of `seg`, an int8 cache block; zero
// probabilities contribute nothing (blocked keys' values and scales may be anything). Sixteen
// rows at a time the weights p[r] · scale_r are rounded to unsigned 8 bits on a grid of their
// largest / 255 and the values weighed as exact integer dot products: a value group holds each
// column of its four rows in one 32-bit lane (int8_rows.h), so one vpdpbusd against the four
// weights adds 64 products into sixteen columns in natural order, scaled back by the grid's
// step. Returns false, having stopped, at a tile with a non-finite weight: a NaN scale, which
// QuantizeInt8Row gives a row that held a NaN or an infinity, and which makes every element of
// the fp32 sum NaN (the forward reports such outputs; a rounded weight would hide it).
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline bool AddSegmentValues(const KvSegment& seg, int64_t n,
                                                       const float* p, __m512 (&acc)[kDim / 16]) {
  const auto* v = static_cast<const int8_t*>(seg.v);
  for (int64_t t = 0; t < n; t += kInt8KeyTileRows) {
    const __mmask16 rows = FirstLanes(n - t);
    const __m512 probabilities = _mm512_maskz_loadu_ps(rows, p + t);
    const __mmask16 open = _mm512_cmp_ps_mask(probabilities, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    const __m512 weights =
        _mm512_maskz_mul_ps(open, probabilities, Scales16(seg.v_scale + t, open));
    if (_mm512_fpclass_ps_mask(weights, 0x99) != 0) return false;
    const float largest = _mm512_reduce_max_ps(weights);
    if (!(largest > 0.0f)) continue;
    const __m128i quantized = _mm512_cvtusepi32_epi8(
        _mm512_cvtps_epi32(_mm512_mul_ps(weights, _mm512_set1_ps(255.0f / largest))));
    alignas(16) int32_t quads[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(quads), quantized);
    __m512i sums[kDim / 16];
#pragma GCC unroll 8
    for (int64_t c = 0; c < kDim / 16; ++c) sums[c] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int64_t g = 0; g < 4; ++g) {
      const __m512i w = _mm512_set1_epi32(quads[g]);
      const int8_t* group = v + (t + kInt8ValueGroupRows * g) * kDim;
#pragma GCC unroll 8
      for (int64_t c = 0; c < kDim / 16; ++c) {
        sums[c] = _mm512_dpbusd_epi32(sums[c], w, _mm512_loadu_si512(group + 64 * c));
      }
    }
    const __m512 step = _mm512_set1_ps(largest * (1.0f / 255.0f));  // One division a tile.
#pragma GCC unroll 8
    for (int64_t c = 0; c < kDim / 16; ++c) {
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[c]), step, acc[c]);
    }
  }
  return true;
}

// AttendRow for an all-int8 row of a kDim-wide head, as the portable kernel structures it (scores
// segment by segment with prefetches two segments ahead, the shared softmax, then the values).
// False, with nothing written, for a query QuantizeQuery refuses.
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET bool AttendRowDim(const RowAttention& a, const float* q_row,
                                            float* probabilities, float* out) {
  alignas(64) int32_t q_pairs[kDim / 2];
  float q_scale = 0.0f;
  if (!QuantizeQuery<kDim>(q_row, q_pairs, q_scale)) return false;
  const int64_t limit = std::clamp<int64_t>(a.visible_limit, 0, a.keys);
  const int64_t segments = static_cast<int64_t>(a.segments.size());
  float max_score = -std::numeric_limits<float>::infinity();
  __m512 max_lanes = _mm512_set1_ps(max_score);
  int64_t open_keys = 0, key = 0;
  for (int64_t si = 0; si < std::min<int64_t>(segments, kAhead); ++si) {
    PrefetchRows(a.segments[si].k, a.segments[si], kDim, a.prefetch);
  }
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    const KvSegment& seg = a.segments[si];
    if (si + kAhead < segments) {
      PrefetchRows(a.segments[si + kAhead].k, a.segments[si + kAhead], kDim, a.prefetch);
    }
    const int64_t n = std::min(seg.count, limit - key);
    ScoreSegment<kDim>(a, seg, n, key, q_pairs, q_scale, probabilities, max_lanes, max_score,
                       open_keys);
    key += n;
  }
  if (a.explicit_row == nullptr) max_score = _mm512_reduce_max_ps(max_lanes);
  for (int64_t si = 0; si < std::min<int64_t>(segments, kAhead); ++si) {
    PrefetchRows(a.segments[si].v, a.segments[si], kDim, a.prefetch);
  }
  if (!SoftmaxRowOrAnswer(probabilities, limit, a.keys, max_score, open_keys, out, kDim)) {
    return true;
  }
  // Every loop over acc (and the tiles' sums) is unrolled by pragma: GCC keeps an array in
  // registers only when no access to it is left inside a loop when it decides.
  __m512 acc[kDim / 16];
#pragma GCC unroll 8
  for (int64_t c = 0; c < kDim / 16; ++c) acc[c] = _mm512_setzero_ps();
  key = 0;
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    const KvSegment& seg = a.segments[si];
    if (si + kAhead < segments) {
      PrefetchRows(a.segments[si + kAhead].v, a.segments[si + kAhead], kDim, a.prefetch);
    }
    const int64_t n = std::min(seg.count, limit - key);
    if (!AddSegmentValues<kDim>(seg, n, probabilities + key, acc)) {
      std::fill(out, out + kDim, std::numeric_limits<float>::quiet_NaN());
      return true;
    }
    key += n;
  }
#pragma GCC unroll 8
  for (int64_t c = 0; c < kDim / 16; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
  return true;
}

}  // namespace

bool HasInt8DotKernel() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
  return has;
}

bool AttendRowInt8Dot(const RowAttention& a, const float* q, float* probabilities, float* out) {
  if (a.head_dim != 64 && a.head_dim != 128) return false;
  for (const KvSegment& seg : a.segments) {
    if (seg.type != KvElementType::kInt8 || seg.int8_block_rows <= 0 ||
        seg.int8_block_rows % kInt8KeyTileRows != 0) {
      return false;
    }
  }
  if (!HasInt8DotKernel()) return false;
  return a.head_dim == 64 ? AttendRowDim<64>(a, q, probabilities, out)
                          : AttendRowDim<128>(a, q, probabilities, out);
}

#else  // No x86 AVX-512 target: the portable kernel always.

bool HasInt8DotKernel() { return false; }

bool AttendRowInt8Dot(const RowAttention&, const float*, float*, float*) { return false; }

#endif

}  // namespace attnserve::core
