#include "core/kv_cache/paged_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/util/per_isa_clones.h"

namespace attnserve::core {
namespace {

// The helpers are always inlined: each must be compiled into every ISA clone of AttendRow (a
// helper left out of line is compiled once, for baseline SSE2).
#define ATTNSERVE_INLINE [[gnu::always_inline]] inline

ATTNSERVE_INLINE float Dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

ATTNSERVE_INLINE void Axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// bf16 → fp32 is exact: the 16 bits become the top half of the float (a zero-extend and a shift,
// which vectorise as vpmovzxwd + vpslld).
ATTNSERVE_INLINE float Widen(uint16_t x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x) << 16);
}

// 16 independent lanes, summed pairwise at the end: an `omp simd reduction` would spill its lanes
// and add them one by one per key, which costs more than the 64-element dot itself in bf16.
constexpr int64_t kLanes = 16;

ATTNSERVE_INLINE float DotBf16(const float* a, const uint16_t* b, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * Widen(b[i + l]);
  }
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
#pragma omp simd
    for (int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  float sum = lanes[0];
  for (; i < n; ++i) sum += a[i] * Widen(b[i]);
  return sum;
}

ATTNSERVE_INLINE void AxpyBf16(float alpha, const uint16_t* x, float* y, int64_t n) {
#pragma omp simd simdlen(16)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * Widen(x[i]);
}

// q · key r of `seg`.
ATTNSERVE_INLINE float KeyDot(const KvSegment& seg, int64_t r, const float* q, int64_t n) {
  if (seg.type == KvElementType::kBFloat16) {
    return DotBf16(q, static_cast<const uint16_t*>(seg.k) + r * seg.ld, n);
  }
  return Dot(q, static_cast<const float*>(seg.k) + r * seg.ld, n);
}

// out += p · value r of `seg`.
ATTNSERVE_INLINE void AddValue(const KvSegment& seg, int64_t r, float p, float* out, int64_t n) {
  if (seg.type == KvElementType::kBFloat16) {
    AxpyBf16(p, static_cast<const uint16_t*>(seg.v) + r * seg.ld, out, n);
  } else {
    Axpy(p, static_cast<const float*>(seg.v) + r * seg.ld, out, n);
  }
}

#undef ATTNSERVE_INLINE

}  // namespace

// Compiled per ISA level: the loops above are bandwidth-bound only on the full vector width.
ATTNSERVE_PER_ISA_CLONES void AttendRow(const RowAttention& a, const float* q, float* probabilities,
                                        float* out) {
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  const int64_t limit = std::clamp<int64_t>(a.visible_limit, 0, a.keys);
  std::fill(out, out + a.head_dim, 0.0f);
  std::fill(probabilities + limit, probabilities + a.keys, 0.0f);

  // Scores of the visible keys; blocked ones get -∞ and are skipped below.
  float max_score = kBlocked;
  int64_t open_keys = 0;
  int64_t key = 0;
  for (const KvSegment& seg : a.segments) {
    const int64_t n = std::min(seg.count, limit - key);
    for (int64_t r = 0; r < n; ++r, ++key) {
      const bool open = a.explicit_row == nullptr || a.explicit_row[key] != 0;
      const float s = open ? a.scale * KeyDot(seg, r, q, a.head_dim) : kBlocked;
      probabilities[key] = s;
      max_score = std::max(max_score, s);  // A NaN score leaves the maximum as it was.
      open_keys += open;
    }
    if (key >= limit) break;
  }
  if (max_score == kBlocked) {
    std::fill(probabilities, probabilities + limit, 0.0f);
    // Open keys whose scores are all NaN or -∞ (fp32 overflow in the projections or the dot
    // products) are not a fully masked row: answering zeros would pass the forward's finiteness
    // check with a wrong output. NaN makes it fail (OutOfRange), as an uncached forward does.
    if (open_keys > 0) std::fill(out, out + a.head_dim, std::numeric_limits<float>::quiet_NaN());
    return;
  }

  float sum = 0.0f;
  for (int64_t j = 0; j < limit; ++j) {
    const float e = std::exp(probabilities[j] - max_score);  // exp(-∞) = 0 for blocked keys.
    probabilities[j] = e;
    sum += e;
  }
  const float inverse = 1.0f / sum;
  key = 0;
  for (const KvSegment& seg : a.segments) {
    const int64_t n = std::min(seg.count, limit - key);
    for (int64_t r = 0; r < n; ++r, ++key) {
      const float p = probabilities[key] * inverse;
      probabilities[key] = p;
      if (p != 0.0f) AddValue(seg, r, p, out, a.head_dim);
    }
    if (key >= limit) break;
  }
}

}  // namespace attnserve::core
