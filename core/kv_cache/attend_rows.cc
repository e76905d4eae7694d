// AttendRows (paged_attention.h): the rows of a prefill chunk over a sequence's cached keys, as
// two GEMMs (Q Kᵀ, then P V) over the keys gathered once into contiguous fp32.
#include <dnnl.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/kv_cache/int8_blocks_as_rows.h"
#include "core/kv_cache/int8_rows.h"
#include "core/kv_cache/paged_attention.h"
#include "core/kv_cache/row_softmax.h"
#include "core/kv_cache/row_vectors.h"
#include "core/util/per_isa_clones.h"
#include "core/util/row_max.h"

namespace attnserve::core {
namespace {

using row_softmax::RowOutcome;
using row_softmax::SoftmaxRow;
using row_vectors::Group;
using row_vectors::kVecFloats;
using row_vectors::LoadGroup;
using row_vectors::StoreGroup;

// Copies the K and V rows of `segments` into k and v ([keys, head_dim] fp32 each). Inlined into
// AttendRows' ISA clones (the bf16 widening vectorises).
[[gnu::always_inline]] inline void GatherKeys(std::span<const KvSegment> segments, int64_t head_dim,
                                              float* k, float* v) {
  for (const KvSegment& seg : segments) {
    for (int64_t r = 0; r < seg.count; ++r, k += head_dim, v += head_dim) {
      if (seg.type == KvElementType::kInt8) {
        const auto* ks = static_cast<const int8_t*>(seg.k) + r * seg.ld;
        const auto* vs = static_cast<const int8_t*>(seg.v) + r * seg.ld;
        const float k_scale = Int8Scale(seg.k_scale[r]), v_scale = Int8Scale(seg.v_scale[r]);
        int64_t i = 0;
        for (; i + 2 * kVecFloats <= head_dim; i += 2 * kVecFloats) {  // As AttendRow reads them.
          Group<2> kg = LoadGroup<2>(ks + i), vg = LoadGroup<2>(vs + i);
          for (int j = 0; j < 2; ++j) {
            kg.v[j] *= k_scale;
            vg.v[j] *= v_scale;
          }
          StoreGroup<2>(kg, k + i);
          StoreGroup<2>(vg, v + i);
        }
        for (; i < head_dim; ++i) {
          k[i] = static_cast<float>(ks[i]) * k_scale;
          v[i] = static_cast<float>(vs[i]) * v_scale;
        }
      } else if (seg.type == KvElementType::kBFloat16) {
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
ATTNSERVE_PER_ISA_CLONES bool AttendRowsClones(const RowAttention& a, int64_t rows,
                                               int64_t limit_step, const float* q, int64_t q_ld,
                                               float* probabilities, float* out, int64_t out_ld,
                                               RowsScratch scratch) {
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
    const float max_score = RowMax(row, limit);
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

}  // namespace

bool AttendRows(const RowAttention& a, int64_t rows, int64_t limit_step, const float* q,
                int64_t q_ld, float* probabilities, float* out, int64_t out_ld,
                RowsScratch scratch) {
  return AttendRowsClones(WithInt8BlocksAsRows(a), rows, limit_step, q, q_ld, probabilities, out,
                          out_ld, scratch);
}

}  // namespace attnserve::core
