// PackedMatrix: a [rows, cols] weight matrix reordered once into the blocked layout oneDNN's
// matmul prefers on this CPU, so that no call ever repacks it.
//
// Immutable after PackMatrix(); safe to share between threads.
#ifndef ATTNSERVE_CORE_FORWARD_PACKED_MATRIX_H_
#define ATTNSERVE_CORE_FORWARD_PACKED_MATRIX_H_

#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "core/util/aligned_buffer.h"

namespace attnserve::core {

struct PackedMatrix {
  int64_t rows = 0;         // K: the input features.
  int64_t cols = 0;         // N: the output features.
  dnnl::memory::desc desc;  // oneDNN's blocked layout; pass it as the matmul weights desc.
  // Owns the packed bytes, possibly together with other matrices (see ShareIfIdentical).
  std::shared_ptr<const AlignedBuffer> storage;
  // desc.get_size() bytes inside *storage, of desc.data_type() (f32 or bf16) elements; typed as
  // float only because the storage is counted in 4-byte units.
  const float* begin = nullptr;

  const float* data() const { return begin; }
  size_t bytes() const { return desc.get_size(); }
  dnnl::memory::data_type data_type() const { return desc.data_type(); }
};

// Packs the row-major [rows, cols] matrix whose row r starts at plain[r * ld] (columns
// [0, cols) are taken; ld >= cols). The layout chosen by oneDNN does not depend on the number of
// activation rows (checked for brgemm f32), so one packing serves every batch size.
// `type` is the packed element type: f32, or bf16 (rounded to nearest even) for matmuls with bf16
// sources. Internal error if oneDNN fails; throws std::bad_alloc if the packed copy cannot be
// allocated.
absl::StatusOr<PackedMatrix> PackMatrix(
    std::span<const float> plain, int64_t rows, int64_t cols, int64_t ld,
    dnnl::memory::data_type type = dnnl::memory::data_type::f32);

// If `whole`'s packed bytes from 4-byte offset `offset` on are exactly `part`'s packed bytes,
// returns `part` reading them from `whole`'s storage (and drops `part`'s own copy); otherwise
// returns `part` unchanged. With oneDNN's column-block-outermost layouts a block of whole columns
// packs to a contiguous range, so W_Q and W_KV can live inside the packed W_QKV; comparing the
// bytes makes that safe whatever layout oneDNN picks.
PackedMatrix ShareIfIdentical(PackedMatrix part, const PackedMatrix& whole, size_t offset);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_PACKED_MATRIX_H_
