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
using row_softmax::RowOutcome;
using row_softmax::SoftmaxRow;

constexpr int64_t kQueryMax = 32767;  // The int16 query's largest |element|.
// Segments prefetched ahead, as the portable kernel does (4 and 8 measured no faster).
constexpr int64_t kAhead = 2;

// The query rounded to int16, 32 elements a register in natural order (as a key row's 32 int8
// sign-extend into one): q[i] ≈ q16[i] · scale. False for a non-finite query (whose scores are
// all NaN) and one whose largest |element| is subnormal: the portable kernel answers those.
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline bool QuantizeQuery(const float* q, __m512i (&q16)[kDim / 32],
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
    q16[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi32_epi16(low)),
                                _mm512_cvtsepi32_epi16(high), 1);
  }
  return true;
}

// Σ q16 · k over one key row, in 16 int32 lanes (exact: |sum| < 32767 · 127 · 128 < 2^31).
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline __m512i DotLanes(const __m512i (&q16)[kDim / 32],
                                                  const int8_t* k) {
  __m512i sum = _mm512_setzero_si512();
  for (int64_t c = 0; c < kDim / 32; ++c) {
    const __m512i x =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 32 * c)));
    sum = _mm512_dpwssd_epi32(sum, q16[c], x);
  }
  return sum;
}

// The lane sums of a, b, c and d as one vector of four.
ATTNSERVE_INT8_DOT_TARGET inline __m128i HorizontalSum4(__m512i a, __m512i b, __m512i c,
                                                        __m512i d) {
  // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], then [a, b, c, d] partial sums.
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i abcd =
      _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i half =
      _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

// Four bf16 scales as floats.
ATTNSERVE_INT8_DOT_TARGET inline __m128 Scales4(const uint16_t* bits) {
  uint64_t four;
  std::memcpy(&four, bits, sizeof four);
  return _mm_castsi128_ps(
      _mm_slli_epi32(_mm_cvtepu16_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(four))), 16));
}

// Scores of keys [key, key + n) of `seg`, four at a time, then the mask and the maximum.
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline void ScoreSegment(const RowAttention& a, const KvSegment& seg,
                                                   int64_t n, int64_t key,
                                                   const __m512i (&q16)[kDim / 32], float q_scale,
                                                   float* scores, float& max_score,
                                                   int64_t& open_keys) {
  const auto* k = static_cast<const int8_t*>(seg.k);
  const int64_t ld = seg.ld;
  const float scale = a.scale * q_scale;
  const __m128 scale4 = _mm_set1_ps(scale);
  int64_t r = 0;
  for (; r + 4 <= n; r += 4) {
    const __m128i sums = HorizontalSum4(
        DotLanes<kDim>(q16, k + r * ld), DotLanes<kDim>(q16, k + (r + 1) * ld),
        DotLanes<kDim>(q16, k + (r + 2) * ld), DotLanes<kDim>(q16, k + (r + 3) * ld));
    const __m128 s =
        _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(sums), scale4), Scales4(seg.k_scale + r));
    _mm_storeu_ps(scores + key + r, s);
  }
  for (; r < n; ++r) {
    const auto sum = static_cast<float>(_mm512_reduce_add_epi32(DotLanes<kDim>(q16, k + r * ld)));
    scores[key + r] = sum * scale * Int8Scale(seg.k_scale[r]);
  }
  MaskAndMax(a.explicit_row, key, n, scores, max_score, open_keys);
}

// acc += Σ p[r] · scale_r · V row r for one row r of `seg` (natural order, 16 floats a
// register), widened to fp32 with one sign-extending load and one conversion per 16 values.
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline void AddRowValues(const int8_t* v_row, float weight,
                                                   __m512 (&acc)[kDim / 16]) {
  const __m512 w = _mm512_set1_ps(weight);
  for (int64_t c = 0; c < kDim / 16; ++c) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v_row + 16 * c));
    acc[c] = _mm512_fmadd_ps(w, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), acc[c]);
  }
}

// AddRowValues for rows [from, to) of `seg` whose probability is not 0 (blocked keys' values and
// scales may be anything).
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline void AddRowsValues(const KvSegment& seg, int64_t from, int64_t to,
                                                    const float* p, __m512 (&acc)[kDim / 16]) {
  const auto* v = static_cast<const int8_t*>(seg.v);
  for (int64_t r = from; r < to; ++r) {
    if (p[r] != 0.0f) AddRowValues<kDim>(v + r * seg.ld, p[r] * Int8Scale(seg.v_scale[r]), acc);
  }
}

// acc += Σ p[r] · scale_r · V row r over the n rows of `seg`; zero probabilities contribute
// nothing (blocked keys' values and scales may be anything). Sixteen rows at a time the weights
// p[r] · scale_r are rounded to unsigned 8 bits on a grid of their largest / 255, and the values
// weighed as exact integer dot products of four rows at once (vpdpbusd over the four rows'
// bytes interleaved per dimension), then scaled back into `grouped`: three instructions per 64
// values instead of three per 16 (a group with a non-finite weight is weighed in fp32). `grouped`
// holds dimension 64c + 16L + 4k + j in register 4c + k, 128-bit lane L, element j (the
// interleave's order; AttendRowDim restores it). The rows past the last full sixteen go to `acc` in
// fp32.
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET inline void AddSegmentValues(const KvSegment& seg, int64_t n,
                                                       const float* p, __m512 (&acc)[kDim / 16],
                                                       __m512 (&grouped)[kDim / 16]) {
  const auto* v = static_cast<const int8_t*>(seg.v);
  const int64_t ld = seg.ld;
  int64_t r = 0;
  for (; r + 16 <= n; r += 16) {
    const __m512 probabilities = _mm512_loadu_ps(p + r);
    const __mmask16 open = _mm512_cmp_ps_mask(probabilities, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    const __m512 scales = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg.v_scale + r))),
        16));
    const __m512 weights = _mm512_maskz_mul_ps(open, probabilities, scales);
    if (_mm512_fpclass_ps_mask(weights, 0x99) != 0) {
      // A non-finite value row (a NaN scale, int8_rows.h): weighed in fp32, so that the output
      // is NaN as the forward expects to report it; a rounded weight would hide it.
      AddRowsValues<kDim>(seg, r, r + 16, p, acc);
      continue;
    }
    const float largest = _mm512_reduce_max_ps(weights);
    if (!(largest > 0.0f)) continue;
    const __m128i quantized = _mm512_cvtusepi32_epi8(
        _mm512_cvtps_epi32(_mm512_mul_ps(weights, _mm512_set1_ps(255.0f / largest))));
    alignas(16) int32_t quads[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(quads), quantized);
    __m512i sums[kDim / 16];
    for (__m512i& x : sums) x = _mm512_setzero_si512();
    for (int64_t s = 0; s < 4; ++s) {
      const __m512i w = _mm512_set1_epi32(quads[s]);
      const int8_t* row = v + (r + 4 * s) * ld;
      for (int64_t c = 0; c < kDim / 64; ++c) {
        const int8_t* at = row + 64 * c;
        const __m512i a = _mm512_loadu_si512(at), b = _mm512_loadu_si512(at + ld);
        const __m512i c2 = _mm512_loadu_si512(at + 2 * ld), d = _mm512_loadu_si512(at + 3 * ld);
        const __m512i ab_low = _mm512_unpacklo_epi8(a, b), ab_high = _mm512_unpackhi_epi8(a, b);
        const __m512i cd_low = _mm512_unpacklo_epi8(c2, d), cd_high = _mm512_unpackhi_epi8(c2, d);
        sums[4 * c] = _mm512_dpbusd_epi32(sums[4 * c], w, _mm512_unpacklo_epi16(ab_low, cd_low));
        sums[4 * c + 1] =
            _mm512_dpbusd_epi32(sums[4 * c + 1], w, _mm512_unpackhi_epi16(ab_low, cd_low));
        sums[4 * c + 2] =
            _mm512_dpbusd_epi32(sums[4 * c + 2], w, _mm512_unpacklo_epi16(ab_high, cd_high));
        sums[4 * c + 3] =
            _mm512_dpbusd_epi32(sums[4 * c + 3], w, _mm512_unpackhi_epi16(ab_high, cd_high));
      }
    }
    const __m512 step = _mm512_set1_ps(largest / 255.0f);
    for (int64_t k = 0; k < kDim / 16; ++k) {
      grouped[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[k]), step, grouped[k]);
    }
  }
  AddRowsValues<kDim>(seg, r, n, p, acc);
}

// AttendRow for an all-int8 row of a kDim-wide head, as the portable kernel structures it (scores
// segment by segment with prefetches two segments ahead, the shared softmax, then the values).
// False, with nothing written, for a query QuantizeQuery refuses.
template <int64_t kDim>
ATTNSERVE_INT8_DOT_TARGET bool AttendRowDim(const RowAttention& a, const float* q_row,
                                            float* probabilities, float* out) {
  __m512i q16[kDim / 32];
  float q_scale = 0.0f;
  if (!QuantizeQuery<kDim>(q_row, q16, q_scale)) return false;
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  const int64_t limit = std::clamp<int64_t>(a.visible_limit, 0, a.keys);
  const int64_t segments = static_cast<int64_t>(a.segments.size());
  float max_score = kBlocked;
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
    ScoreSegment<kDim>(a, seg, n, key, q16, q_scale, probabilities, max_score, open_keys);
    key += n;
  }
  for (int64_t si = 0; si < std::min<int64_t>(segments, kAhead); ++si) {
    PrefetchRows(a.segments[si].v, a.segments[si], kDim, a.prefetch);
  }
  switch (SoftmaxRow(probabilities, limit, a.keys, max_score, open_keys)) {
    case RowOutcome::kAllBlocked:
      std::fill(out, out + kDim, 0.0f);
      return true;
    case RowOutcome::kNoFiniteScore:
      std::fill(out, out + kDim, std::numeric_limits<float>::quiet_NaN());
      return true;
    case RowOutcome::kProbabilities:
      break;
  }
  __m512 acc[kDim / 16], grouped[kDim / 16];
  for (__m512& x : acc) x = _mm512_setzero_ps();
  for (__m512& x : grouped) x = _mm512_setzero_ps();
  key = 0;
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    const KvSegment& seg = a.segments[si];
    if (si + kAhead < segments) {
      PrefetchRows(a.segments[si + kAhead].v, a.segments[si + kAhead], kDim, a.prefetch);
    }
    const int64_t n = std::min(seg.count, limit - key);
    AddSegmentValues<kDim>(seg, n, probabilities + key, acc, grouped);
    key += n;
  }
  for (int64_t c = 0; c < kDim / 16; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
  // grouped's register 4c + k, lane L, element j is dimension 64c + 16L + 4k + j.
  alignas(64) float lanes[kDim];
  for (int64_t k = 0; k < kDim / 16; ++k) _mm512_store_ps(lanes + 16 * k, grouped[k]);
  for (int64_t c = 0; c < kDim / 64; ++c) {
    for (int64_t k = 0; k < 4; ++k) {
      for (int64_t lane = 0; lane < 4; ++lane) {
        for (int64_t j = 0; j < 4; ++j) {
          out[64 * c + 16 * lane + 4 * k + j] += lanes[64 * c + 16 * k + 4 * lane + j];
        }
      }
    }
  }
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
    if (seg.type != KvElementType::kInt8) return false;
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
