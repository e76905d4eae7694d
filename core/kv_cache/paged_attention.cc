#include "core/kv_cache/paged_attention.h"

#include <dnnl.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

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

// Asks for the first rows of a segment's K (or V) at `rows` to be brought into the cache. A paged
// row's keys sit in blocks of a few KB scattered over the pool: the hardware prefetcher restarts
// at every block, and without this the kernel stalls on the first lines of each block (two thirds
// of its cycles at 128 cached tokens). At most kPrefetchRows rows: past them a long segment is one
// stream the hardware prefetcher follows, and asking for all of it at once would evict the rows
// in use.
ATTNSERVE_INLINE void PrefetchRows(const void* rows, const KvSegment& seg, int64_t head_dim) {
  constexpr int64_t kLine = 64, kPrefetchRows = 32;
  const auto* base = static_cast<const char*>(rows);
  const int64_t row_bytes = head_dim * ElementBytes(seg.type);
  const int64_t ld_bytes = seg.ld * ElementBytes(seg.type);
  for (int64_t r = 0; r < std::min(seg.count, kPrefetchRows); ++r) {
    for (int64_t b = 0; b < row_bytes; b += kLine) __builtin_prefetch(base + r * ld_bytes + b);
  }
}

// What SoftmaxRow made of a row.
enum class RowOutcome {
  kProbabilities,  // A softmax over the open keys.
  kAllBlocked,     // Every key blocked: zero probabilities, the output must be zero.
  kNoFiniteScore,  // Open keys, but all their scores NaN or -∞: the output must be NaN.
};

// Turns scores[0, limit) (scaled; -∞ for blocked keys, `open_keys` of them not blocked; their
// maximum `max_score`, NaN scores ignored) into softmax probabilities in place and zeroes
// scores[limit, keys). Shared by AttendRow and AttendRows so that both give a row exactly the same
// semantics. The caller takes the maximum while it writes the scores: a separate pass would be
// scalar (NaN semantics keep it from vectorising) and cost a decode step ~5%.
ATTNSERVE_INLINE RowOutcome SoftmaxRow(float* scores, int64_t limit, int64_t keys, float max_score,
                                       int64_t open_keys) {
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  std::fill(scores + limit, scores + keys, 0.0f);
  if (max_score == kBlocked) {
    std::fill(scores, scores + limit, 0.0f);
    // Open keys whose scores are all NaN or -∞ (fp32 overflow in the projections or the dot
    // products) are not a fully masked row: answering zeros would pass the forward's finiteness
    // check with a wrong output. NaN makes it fail (OutOfRange), as an uncached forward does.
    return open_keys > 0 ? RowOutcome::kNoFiniteScore : RowOutcome::kAllBlocked;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < limit; ++j) {
    const float e = std::exp(scores[j] - max_score);  // exp(-∞) = 0 for blocked keys.
    scores[j] = e;
    sum += e;
  }
  const float inverse = 1.0f / sum;
  for (int64_t j = 0; j < limit; ++j) scores[j] *= inverse;
  return RowOutcome::kProbabilities;
}

// out[dim] += Σ probabilities[key] · V[key] over the first `limit` keys of a's segments.
ATTNSERVE_INLINE void AddValues(const RowAttention& a, const float* probabilities, int64_t limit,
                                float* out, int64_t dim) {
  const int64_t segments = static_cast<int64_t>(a.segments.size());
  if (segments > 0) PrefetchRows(a.segments[0].v, a.segments[0], dim);
  int64_t key = 0;
  for (int64_t si = 0; si < segments && key < limit; ++si) {
    const KvSegment& seg = a.segments[si];
    if (si + 1 < segments) PrefetchRows(a.segments[si + 1].v, a.segments[si + 1], dim);
    const int64_t n = std::min(seg.count, limit - key);
    for (int64_t r = 0; r < n; ++r, ++key) {
      const float p = probabilities[key];
      if (p != 0.0f) AddValue(seg, r, p, out, dim);
    }
  }
}

// AttendRow for head_dim == kDim, or any head_dim (read from `a`) when kDim is 0. A compile-time
// width lets the compiler unroll the dot products and keep the output row in registers across all
// keys instead of loading and storing it once per key.
template <int64_t kDim>
ATTNSERVE_INLINE void AttendRowOfWidth(const RowAttention& a, const float* q, float* probabilities,
                                       float* out) {
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  const int64_t dim = kDim > 0 ? kDim : a.head_dim;
  const int64_t limit = std::clamp<int64_t>(a.visible_limit, 0, a.keys);
  std::fill(out, out + dim, 0.0f);

  // Scores of the visible keys; blocked ones get -∞ and are skipped below.
  float max_score = kBlocked;
  int64_t open_keys = 0;
  int64_t key = 0;
  const int64_t segments = static_cast<int64_t>(a.segments.size());
  if (segments > 0) PrefetchRows(a.segments[0].k, a.segments[0], dim);
  for (int64_t si = 0; si < segments; ++si) {
    const KvSegment& seg = a.segments[si];
    // The next segment's keys while this one's are scored.
    if (si + 1 < segments) PrefetchRows(a.segments[si + 1].k, a.segments[si + 1], dim);
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
  switch (SoftmaxRow(probabilities, limit, a.keys, max_score, open_keys)) {
    case RowOutcome::kAllBlocked:
      return;
    case RowOutcome::kNoFiniteScore:
      std::fill(out, out + dim, std::numeric_limits<float>::quiet_NaN());
      return;
    case RowOutcome::kProbabilities:
      break;
  }
  if constexpr (kDim > 0) {
    float sum[kDim] = {};  // A local array of constant size: the compiler keeps it in registers.
    AddValues(a, probabilities, limit, sum, kDim);
    std::copy(sum, sum + kDim, out);
  } else {
    AddValues(a, probabilities, limit, out, dim);
  }
}

#undef ATTNSERVE_INLINE

}  // namespace

// Compiled per ISA level: the loops above are bandwidth-bound only on the full vector width.
ATTNSERVE_PER_ISA_CLONES void AttendRow(const RowAttention& a, const float* q, float* probabilities,
                                        float* out) {
  switch (a.head_dim) {  // The common head widths, unrolled.
    case 32:
      return AttendRowOfWidth<32>(a, q, probabilities, out);
    case 64:
      return AttendRowOfWidth<64>(a, q, probabilities, out);
    case 128:
      return AttendRowOfWidth<128>(a, q, probabilities, out);
    default:
      return AttendRowOfWidth<0>(a, q, probabilities, out);
  }
}

// Copies the K and V rows of `segments` into k and v ([keys, head_dim] fp32 each). Inlined into
// AttendRows' ISA clones (the bf16 widening vectorises).
[[gnu::always_inline]] inline void GatherKeys(std::span<const KvSegment> segments, int64_t head_dim,
                                              float* k, float* v) {
  for (const KvSegment& seg : segments) {
    for (int64_t r = 0; r < seg.count; ++r, k += head_dim, v += head_dim) {
      if (seg.type == KvElementType::kBFloat16) {
        const auto* ks = static_cast<const uint16_t*>(seg.k) + r * seg.ld;
        const auto* vs = static_cast<const uint16_t*>(seg.v) + r * seg.ld;
        for (int64_t i = 0; i < head_dim; ++i) {
          k[i] = std::bit_cast<float>(static_cast<uint32_t>(ks[i]) << 16);
          v[i] = std::bit_cast<float>(static_cast<uint32_t>(vs[i]) << 16);
        }
      } else {
        const auto* ks = static_cast<const float*>(seg.k) + r * seg.ld;
        const auto* vs = static_cast<const float*>(seg.v) + r * seg.ld;
        std::copy(ks, ks + head_dim, k);
        std::copy(vs, vs + head_dim, v);
      }
    }
  }
}

// Compiled per ISA level: the mask, softmax and gather loops around the GEMMs vectorise.
ATTNSERVE_PER_ISA_CLONES bool AttendRows(const RowAttention& a, int64_t rows, int64_t limit_step,
                                         const float* q, int64_t q_ld, float* probabilities,
                                         float* out, int64_t out_ld, RowsScratch scratch) {
  constexpr float kBlocked = -std::numeric_limits<float>::infinity();
  const int64_t keys = a.keys, dk = a.head_dim;
  GatherKeys(a.segments, dk, scratch.k, scratch.v);
  // probabilities[rows, keys] = scale · Q Kᵀ, every key of every row (blocked ones overwritten).
  if (dnnl_sgemm('N', 'T', rows, keys, dk, a.scale, q, q_ld, scratch.k, dk, 0.0f, probabilities,
                 keys) != dnnl_success) {
    return false;
  }
  // Rows left without probabilities get their zero or NaN output after P·V (which gives 0 there).
  int64_t first_nan_row = rows;
  std::vector<bool> nan_rows;
  for (int64_t j = 0; j < rows; ++j) {
    float* row = probabilities + j * keys;
    const int64_t limit = std::clamp<int64_t>(a.visible_limit + j * limit_step, 0, keys);
    int64_t open_keys = limit;
    if (a.explicit_row != nullptr) {
      const uint8_t* mask = a.explicit_row + j * keys;
      open_keys = 0;
      for (int64_t i = 0; i < limit; ++i) {
        if (mask[i] == 0) row[i] = kBlocked;
        open_keys += mask[i] != 0;
      }
    }
    float max_score = kBlocked;
    for (int64_t i = 0; i < limit; ++i) max_score = std::max(max_score, row[i]);  // Skips NaN.
    if (SoftmaxRow(row, limit, keys, max_score, open_keys) == RowOutcome::kNoFiniteScore) {
      if (first_nan_row == rows) nan_rows.assign(rows, false);
      first_nan_row = std::min(first_nan_row, j);
      nan_rows[j] = true;
    }
  }
  // out[rows, head_dim] = P V.
  if (dnnl_sgemm('N', 'N', rows, dk, keys, 1.0f, probabilities, keys, scratch.v, dk, 0.0f, out,
                 out_ld) != dnnl_success) {
    return false;
  }
  for (int64_t j = first_nan_row; j < rows; ++j) {
    if (nan_rows[j]) {
      std::fill(out + j * out_ld, out + j * out_ld + dk, std::numeric_limits<float>::quiet_NaN());
    }
  }
  return true;
}

}  // namespace attnserve::core
