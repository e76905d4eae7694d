#include "core/kv_cache/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/kv_cache/int8_blocks_as_rows.h"
#include "core/kv_cache/int8_dot_kernel.h"
#include "core/kv_cache/int8_rows.h"
#include "core/kv_cache/row_prefetch.h"
#include "core/kv_cache/row_softmax.h"
#include "core/kv_cache/row_vectors.h"
#include "core/util/l3_cache_bytes.h"
#include "core/util/per_isa_clones.h"

namespace attnserve::core {
namespace {

using row_prefetch::PrefetchRows;
using row_softmax::MaskAndMax;
using row_softmax::SoftmaxRowOrAnswer;
using row_vectors::Group;
using row_vectors::HorizontalMax;
using row_vectors::HorizontalSum;
using row_vectors::HorizontalSum16;
using row_vectors::HorizontalSum4;
using row_vectors::kVecFloats;
using row_vectors::LoadGroup;
using row_vectors::StoreGroup;
using row_vectors::ToFloat;
using row_vectors::Vec16;

// The helpers are always inlined: each must be compiled into every ISA clone of AttendRow (a
// helper left out of line is compiled once, for baseline SSE2).
#define ATTNSERVE_INLINE [[gnu::always_inline]] inline
#define ATTNSERVE_LAMBDA_INLINE __attribute__((always_inline))

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

// 16 independent lanes, summed pairwise at the end: an `omp simd reduction` would spill its lanes
// and add them one by one per key, which costs more than the 64-element dot itself in bf16.
constexpr int64_t kLanes = 16;

// a · b over n elements of a bf16 or int8 row (widened as they are read).
template <typename T>
ATTNSERVE_INLINE float DotWidened(const float* a, const T* b, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * ToFloat(b[i + l]);
  }
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
#pragma omp simd
    for (int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  float sum = lanes[0];
  for (; i < n; ++i) sum += a[i] * ToFloat(b[i]);
  return sum;
}

// y += alpha · x over n elements of a bf16 or int8 row.
template <typename T>
ATTNSERVE_INLINE void AxpyWidened(float alpha, const T* x, float* y, int64_t n) {
#pragma omp simd simdlen(16)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * ToFloat(x[i]);
}

// q · key r of `seg`.
ATTNSERVE_INLINE float KeyDot(const KvSegment& seg, int64_t r, const float* q, int64_t n) {
  switch (seg.type) {
    case KvElementType::kBFloat16:
      return DotWidened(q, static_cast<const uint16_t*>(seg.k) + r * seg.ld, n);
    case KvElementType::kInt8:
      return DotWidened(q, static_cast<const int8_t*>(seg.k) + r * seg.ld, n) *
             Int8Scale(seg.k_scale[r]);
    default:
      return Dot(q, static_cast<const float*>(seg.k) + r * seg.ld, n);
  }
}

// out += p · value r of `seg`.
ATTNSERVE_INLINE void AddValue(const KvSegment& seg, int64_t r, float p, float* out, int64_t n) {
  switch (seg.type) {
    case KvElementType::kBFloat16:
      return AxpyWidened(p, static_cast<const uint16_t*>(seg.v) + r * seg.ld, out, n);
    case KvElementType::kInt8:
      return AxpyWidened(p * Int8Scale(seg.v_scale[r]),
                         static_cast<const int8_t*>(seg.v) + r * seg.ld, out, n);
    default:
      return Axpy(p, static_cast<const float*>(seg.v) + r * seg.ld, out, n);
  }
}

// out[dim] += Σ probabilities[key] · V[key] over the first `limit` keys of a's segments.
ATTNSERVE_INLINE void AddValues(const RowAttention& a, const float* probabilities, int64_t limit,
                                float* out, int64_t dim) {
  const int64_t segments = static_cast<int64_t>(a.segments.size());
  if (segments > 0) PrefetchRows(a.segments[0].v, a.segments[0], dim, a.prefetch);
  int64_t key = 0;
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    const KvSegment& seg = a.segments[si];
    if (si + 1 < segments) PrefetchRows(a.segments[si + 1].v, a.segments[si + 1], dim, a.prefetch);
    const int64_t n = std::min(seg.count, limit - key);
    for (int64_t r = 0; r < n; ++r, ++key) {
      const float p = probabilities[key];
      if (p != 0.0f) AddValue(seg, r, p, out, dim);
    }
  }
}

// The products q · k (kDim/16 lanes each), before their lanes are summed; q in kG order.
template <int64_t kDim, int kG, typename T>
ATTNSERVE_INLINE Vec16 DotLanes(const Vec16 (&q)[kDim / kVecFloats], const T* k) {
  constexpr int64_t kChunk = kG * kVecFloats;
  Vec16 sums[2] = {};  // Two chains of additions, not one.
#pragma GCC unroll 8
  for (int64_t c = 0; c < kDim / kChunk; ++c) {
    const Group<kG> x = LoadGroup<kG>(k + c * kChunk);
#pragma GCC unroll 4
    for (int j = 0; j < kG; ++j) sums[(c * kG + j) % 2] += q[c * kG + j] * x.v[j];
  }
  return sums[0] + sums[1];
}

// What multiplies key r's dot product: an int8 key's scale, 1 for the other types.
template <typename T>
ATTNSERVE_INLINE float KeyScale(const KvSegment& seg, int64_t r) {
  if constexpr (std::is_same_v<T, int8_t>) {
    return Int8Scale(seg.k_scale[r]);
  } else {
    return 1.0f;
  }
}

// Scores of keys [key, key + n) from `seg` (rows of T), sixteen keys at a time, then four, then
// one, with AttendRow's semantics: blocked keys -∞, the maximum over the others (NaN ignored) and
// their count.
template <int64_t kDim, int kG, typename T>
ATTNSERVE_INLINE void ScoreSegment(const RowAttention& a, const KvSegment& seg, int64_t n,
                                   int64_t key, const Vec16 (&q)[kDim / kVecFloats], float* scores,
                                   float& max_score, int64_t& open_keys) {
  const T* k = static_cast<const T*>(seg.k);
  const int64_t ld = seg.ld;
  int64_t r = 0;
  // Sixteen keys a vector: their scores stored at once and, with no explicit mask, their maximum
  // taken on vectors (two scalar passes per key cost as much as its dot product in bf16). Only for
  // a cache's own element order (fp32 natural, bf16 paired): each instance unrolls sixteen dot
  // products, and one for every order, type and clone tripled this file's compile time.
  Vec16 max16 = Vec16{} - std::numeric_limits<float>::infinity();
  if constexpr ((kG == 1 && std::is_same_v<T, float>) || (kG == 2 && std::is_same_v<T, uint16_t>)) {
    for (; r + kVecFloats <= n; r += kVecFloats) {
      const Vec16 s = a.scale * HorizontalSum16([&](int64_t i) ATTNSERVE_LAMBDA_INLINE {
                        return DotLanes<kDim, kG>(q, k + (r + i) * ld);
                      });
      std::memcpy(scores + key + r, &s, sizeof s);
      max16 = s > max16 ? s : max16;  // A NaN score leaves the maximum as it was.
    }
  }
  // The keys MaskAndMax still has to see.
  const int64_t vector_keys = a.explicit_row == nullptr ? r : 0;
  if (vector_keys > 0) {
    max_score = std::max(max_score, HorizontalMax(max16));
    open_keys += vector_keys;
  }
  for (; r + 4 <= n; r += 4) {
    const Vec16 sums = HorizontalSum4(
        DotLanes<kDim, kG>(q, k + r * ld), DotLanes<kDim, kG>(q, k + (r + 1) * ld),
        DotLanes<kDim, kG>(q, k + (r + 2) * ld), DotLanes<kDim, kG>(q, k + (r + 3) * ld));
    for (int64_t i = 0; i < 4; ++i) {
      scores[key + r + i] = a.scale * (sums[4 * i] * KeyScale<T>(seg, r + i));
    }
  }
  for (; r < n; ++r) {
    scores[key + r] =
        a.scale * (HorizontalSum(DotLanes<kDim, kG>(q, k + r * ld)) * KeyScale<T>(seg, r));
  }
  MaskAndMax(a.explicit_row, key + vector_keys, n - vector_keys, scores, max_score, open_keys);
}

// acc += Σ p[r] · V row r over n rows of `seg`, acc in kG order; zero probabilities skipped
// (blocked keys' values may be anything, even non-finite).
template <int64_t kDim, int kG, typename T>
ATTNSERVE_INLINE void AddSegmentValues(const KvSegment& seg, int64_t n, const float* p,
                                       Vec16 (&acc)[kDim / kVecFloats]) {
  const T* v = static_cast<const T*>(seg.v);
  for (int64_t r = 0; r < n; ++r) {
    if (p[r] == 0.0f) continue;
    float w = p[r];
    if constexpr (std::is_same_v<T, int8_t>) w *= Int8Scale(seg.v_scale[r]);
    const Vec16 weight = Vec16{} + w;
    constexpr int64_t kChunk = kG * kVecFloats;
#pragma GCC unroll 8
    for (int64_t c = 0; c < kDim / kChunk; ++c) {
      const Group<kG> x = LoadGroup<kG>(v + r * seg.ld + c * kChunk);
#pragma GCC unroll 4
      for (int j = 0; j < kG; ++j) acc[c * kG + j] += weight * x.v[j];
    }
  }
}

// AttendRow for a head width that is a multiple of 16·kG, known at compile time: the query and
// the output row stay in vector registers across all keys, in kG order (LoadGroup).
template <int64_t kDim, int kG>
ATTNSERVE_INLINE void AttendRowVec(const RowAttention& a, const float* q_row, float* probabilities,
                                   float* out) {
  static_assert(kDim % (kG * kVecFloats) == 0);
  constexpr int64_t kParts = kDim / kVecFloats, kChunk = kG * kVecFloats;
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  const int64_t limit = std::clamp<int64_t>(a.visible_limit, 0, a.keys);
  Vec16 q[kParts];
  for (int64_t c = 0; c < kDim / kChunk; ++c) {
    const Group<kG> group = LoadGroup<kG>(q_row + c * kChunk);
    for (int j = 0; j < kG; ++j) q[c * kG + j] = group.v[j];
  }

  float max_score = kBlocked;
  int64_t open_keys = 0;
  int64_t key = 0;
  const int64_t segments = static_cast<int64_t>(a.segments.size());
  // Rows are prefetched two segments ahead: at 128 cached tokens of 64 sequences, one segment's
  // work is shorter than an L3 miss. V's first segments are asked for before the softmax, which
  // hides their latency.
  for (int64_t si = 0; si < std::min<int64_t>(segments, 2); ++si) {
    PrefetchRows(a.segments[si].k, a.segments[si], kDim, a.prefetch);
  }
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    const KvSegment& seg = a.segments[si];
    if (si + 2 < segments) PrefetchRows(a.segments[si + 2].k, a.segments[si + 2], kDim, a.prefetch);
    const int64_t n = std::min(seg.count, limit - key);
    switch (seg.type) {
      case KvElementType::kBFloat16:
        ScoreSegment<kDim, kG, uint16_t>(a, seg, n, key, q, probabilities, max_score, open_keys);
        break;
      case KvElementType::kInt8:
        ScoreSegment<kDim, kG, int8_t>(a, seg, n, key, q, probabilities, max_score, open_keys);
        break;
      case KvElementType::kFloat32:
        ScoreSegment<kDim, kG, float>(a, seg, n, key, q, probabilities, max_score, open_keys);
        break;
    }
    key += n;
  }
  for (int64_t si = 0; si < std::min<int64_t>(segments, 2); ++si) {
    PrefetchRows(a.segments[si].v, a.segments[si], kDim, a.prefetch);
  }
  if (!SoftmaxRowOrAnswer(probabilities, limit, a.keys, max_score, open_keys, out, kDim)) return;
  Vec16 acc[kParts] = {};
  key = 0;
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    const KvSegment& seg = a.segments[si];
    if (si + 2 < segments) PrefetchRows(a.segments[si + 2].v, a.segments[si + 2], kDim, a.prefetch);
    const int64_t n = std::min(seg.count, limit - key);
    switch (seg.type) {
      case KvElementType::kBFloat16:
        AddSegmentValues<kDim, kG, uint16_t>(seg, n, probabilities + key, acc);
        break;
      case KvElementType::kInt8:
        AddSegmentValues<kDim, kG, int8_t>(seg, n, probabilities + key, acc);
        break;
      case KvElementType::kFloat32:
        AddSegmentValues<kDim, kG, float>(seg, n, probabilities + key, acc);
        break;
    }
    key += n;
  }
  for (int64_t c = 0; c < kDim / kChunk; ++c) {
    Group<kG> group;
    for (int j = 0; j < kG; ++j) group.v[j] = acc[c * kG + j];
    StoreGroup<kG>(group, out + c * kChunk);
  }
}

// ---- Rows whose keys are all int8 cache blocks (int8_rows.h), in fp32 ----
// A key tile's column pair of sixteen rows widens into two vectors whose lane r is key r
// (LoadGroup<2>), and a value group's sixteen columns of four rows into four vectors whose lane i
// is column i of one row (LoadGroup<4>): sixteen keys are scored at once with no sums across
// lanes, and values add up in natural order.

// Whether AttendRowInt8Blocks reads `a`: every segment an int8 block of whole key tiles.
bool ReadsInt8Blocks(const RowAttention& a) {
  if (a.head_dim != 32 && a.head_dim != 64 && a.head_dim != 128) return false;
  for (const KvSegment& seg : a.segments) {
    if (seg.type != KvElementType::kInt8 || seg.int8_block_rows <= 0 ||
        seg.int8_block_rows % kInt8KeyTileRows != 0) {
      return false;
    }
  }
  return true;
}

// Scores of keys [key, key + n) of an int8 block, sixteen at a time (a tile's keys past n are
// read, not stored), then AttendRow's mask and maximum.
template <int64_t kDim>
ATTNSERVE_INLINE void ScoreInt8Block(const RowAttention& a, const KvSegment& seg, int64_t n,
                                     int64_t key, const float* q, float* scores, float& max_score,
                                     int64_t& open_keys) {
  const auto* k = static_cast<const int8_t*>(seg.k);
  for (int64_t t = 0; t < n; t += kInt8KeyTileRows) {
    const int8_t* tile = k + t * kDim;
    // Two chains of additions, not one; named, not an array, which GCC would keep in memory.
    Vec16 even = {}, odd = {};
#pragma GCC unroll 16
    for (int64_t j = 0; j < kDim / 2; j += 2) {
      const Group<2> x = LoadGroup<2>(tile + 32 * j), y = LoadGroup<2>(tile + 32 * (j + 1));
      even += q[2 * j] * x.v[0] + q[2 * j + 1] * x.v[1];
      odd += q[2 * j + 2] * y.v[0] + q[2 * j + 3] * y.v[1];
    }
    const Vec16 dots = even + odd;
    const int64_t rows = std::min(kInt8KeyTileRows, n - t);
    for (int64_t r = 0; r < rows; ++r) {
      scores[key + t + r] = a.scale * (dots[r] * Int8Scale(seg.k_scale[t + r]));
    }
  }
  MaskAndMax(a.explicit_row, key, n, scores, max_score, open_keys);
}

// acc (natural order) += Σ p[r] · scale_r · V row r over rows [0, n) of an int8 block; zero
// probabilities weigh nothing (blocked keys' values and scales may be anything).
template <int64_t kDim>
ATTNSERVE_INLINE void AddInt8BlockValues(const KvSegment& seg, int64_t n, const float* p,
                                         Vec16 (&acc)[kDim / kVecFloats]) {
  const auto* v = static_cast<const int8_t*>(seg.v);
  for (int64_t g = 0; g * kInt8ValueGroupRows < n; ++g) {
    float w[kInt8ValueGroupRows] = {};
    for (int64_t r = 0; r < kInt8ValueGroupRows && g * kInt8ValueGroupRows + r < n; ++r) {
      const int64_t row = g * kInt8ValueGroupRows + r;
      if (p[row] != 0.0f) w[r] = p[row] * Int8Scale(seg.v_scale[row]);
    }
    const int8_t* group = v + g * kInt8ValueGroupRows * kDim;
#pragma GCC unroll 8
    for (int64_t c = 0; c < kDim / kVecFloats; ++c) {
      const Group<4> x = LoadGroup<4>(group + 4 * kVecFloats * c);
      acc[c] += w[0] * x.v[0] + w[1] * x.v[1] + w[2] * x.v[2] + w[3] * x.v[3];
    }
  }
}

// AttendRow for a row whose keys are all int8 blocks (ReadsInt8Blocks), a kDim-wide head.
template <int64_t kDim>
ATTNSERVE_INLINE void AttendRowInt8Blocks(const RowAttention& a, const float* q,
                                          float* probabilities, float* out) {
  const int64_t limit = std::clamp<int64_t>(a.visible_limit, 0, a.keys);
  const int64_t segments = static_cast<int64_t>(a.segments.size());
  float max_score = -std::numeric_limits<float>::infinity();
  int64_t open_keys = 0, key = 0;
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    if (si + 2 < segments) PrefetchRows(a.segments[si + 2].k, a.segments[si + 2], kDim, a.prefetch);
    const int64_t n = std::min(a.segments[si].count, limit - key);
    ScoreInt8Block<kDim>(a, a.segments[si], n, key, q, probabilities, max_score, open_keys);
    key += n;
  }
  if (!SoftmaxRowOrAnswer(probabilities, limit, a.keys, max_score, open_keys, out, kDim)) return;
  Vec16 acc[kDim / kVecFloats] = {};
  key = 0;
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    if (si + 2 < segments) PrefetchRows(a.segments[si + 2].v, a.segments[si + 2], kDim, a.prefetch);
    const int64_t n = std::min(a.segments[si].count, limit - key);
    AddInt8BlockValues<kDim>(a.segments[si], n, probabilities + key, acc);
    key += n;
  }
  std::memcpy(out, acc, sizeof acc);
}

// AttendRow for any head_dim (read from `a`).
ATTNSERVE_INLINE void AttendRowAnyWidth(const RowAttention& a, const float* q, float* probabilities,
                                        float* out) {
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  const int64_t dim = a.head_dim;
  const int64_t limit = std::clamp<int64_t>(a.visible_limit, 0, a.keys);
  std::fill(out, out + dim, 0.0f);

  // Scores of the visible keys; blocked ones get -∞ and are skipped below.
  float max_score = kBlocked;
  int64_t open_keys = 0;
  int64_t key = 0;
  const int64_t segments = static_cast<int64_t>(a.segments.size());
  if (segments > 0) PrefetchRows(a.segments[0].k, a.segments[0], dim, a.prefetch);
  for (int64_t si = 0; si < segments; ++si) {
    const KvSegment& seg = a.segments[si];
    if (si + 1 < segments) PrefetchRows(a.segments[si + 1].k, a.segments[si + 1], dim, a.prefetch);
    const int64_t n = std::min(seg.count, limit - key);
    for (int64_t r = 0; r < n; ++r, ++key) {
      const bool open = a.explicit_row == nullptr || a.explicit_row[key] != 0;
      const float s = open ? a.scale * KeyDot(seg, r, q, dim) : kBlocked;
      probabilities[key] = s;
      max_score = std::max(max_score, s);  // A NaN score leaves the maximum as it was.
      open_keys += open;
    }
    if (key >= limit) break;
  }
  if (!SoftmaxRowOrAnswer(probabilities, limit, a.keys, max_score, open_keys, out, dim)) return;
  AddValues(a, probabilities, limit, out, dim);
}

#undef ATTNSERVE_INLINE
#undef ATTNSERVE_LAMBDA_INLINE

// Compiled per ISA level: the loops above are bandwidth-bound only on the full vector width.
// For a row ReadsInt8Blocks takes.
ATTNSERVE_PER_ISA_CLONES void AttendRowInt8BlocksClones(const RowAttention& a, const float* q,
                                                        float* probabilities, float* out) {
  return a.head_dim == 32   ? AttendRowInt8Blocks<32>(a, q, probabilities, out)
         : a.head_dim == 64 ? AttendRowInt8Blocks<64>(a, q, probabilities, out)
                            : AttendRowInt8Blocks<128>(a, q, probabilities, out);
}

// For every other row (AttendRow copies int8 blocks out to rows first).
ATTNSERVE_PER_ISA_CLONES void AttendRowClones(const RowAttention& a, const float* q,
                                              float* probabilities, float* out) {
  // The element order of the row's first segment (LoadGroup): fp32 natural, bf16 paired, int8 in
  // fours (in pairs for 32-wide heads).
  const KvElementType type = a.segments.empty() ? KvElementType::kFloat32 : a.segments[0].type;
  const int group = type == KvElementType::kFloat32 ? 1 : type == KvElementType::kInt8 ? 4 : 2;
  switch (a.head_dim) {  // The common head widths, unrolled.
    case 32:
      return group == 1 ? AttendRowVec<32, 1>(a, q, probabilities, out)
                        : AttendRowVec<32, 2>(a, q, probabilities, out);
    case 64:
      if (group == 4) return AttendRowVec<64, 4>(a, q, probabilities, out);
      return group == 1 ? AttendRowVec<64, 1>(a, q, probabilities, out)
                        : AttendRowVec<64, 2>(a, q, probabilities, out);
    case 128:
      if (group == 4) return AttendRowVec<128, 4>(a, q, probabilities, out);
      return group == 1 ? AttendRowVec<128, 1>(a, q, probabilities, out)
                        : AttendRowVec<128, 2>(a, q, probabilities, out);
    default:
      return AttendRowAnyWidth(a, q, probabilities, out);
  }
}

}  // namespace

PrefetchTarget PrefetchTargetFor(int64_t kv_bytes) {
  static const int64_t l3_bytes = L3CacheBytes();
  return kv_bytes > l3_bytes ? PrefetchTarget::kL2 : PrefetchTarget::kL1;
}

void AttendRow(const RowAttention& a, const float* q, float* probabilities, float* out) {
  if (a.int8_dot && AttendRowInt8Dot(a, q, probabilities, out)) return;
  if (ReadsInt8Blocks(a)) return AttendRowInt8BlocksClones(a, q, probabilities, out);
  // A head width other than 32, 64 and 128, blocks of other than whole tiles, mixed types.
  AttendRowClones(WithInt8BlocksAsRows(a), q, probabilities, out);
}

}  // namespace attnserve::core
