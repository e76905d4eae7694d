// PackedMatrix: a [rows, cols] weight matrix reordered once into the blocked layout oneDNN's
// matmul prefers on this CPU, so that no call ever repacks it.
//
// Immutable after PackMatrix(); safe to share between threads.
#ifndef ATTNSERVE_CORE_PACKED_MATRIX_H_
#define ATTNSERVE_CORE_PACKED_MATRIX_H_

#include <cstdint>
#include <dnnl.hpp>
#include <span>

#include "absl/status/statusor.h"
#include "core/aligned_buffer.h"

namespace attnserve::core {

struct PackedMatrix {
  int64_t rows = 0;         // K: the input features.
  int64_t cols = 0;         // N: the output features.
  dnnl::memory::desc desc;  // oneDNN's blocked layout; pass it as the matmul weights desc.
  AlignedBuffer storage;    // desc.get_size() bytes.

  const float* data() const { return storage.data(); }
};

// Packs the row-major [rows, cols] matrix whose row r starts at plain[r * ld] (columns
// [0, cols) are taken; ld >= cols). The layout chosen by oneDNN does not depend on the number of
// activation rows (checked for brgemm f32), so one packing serves every batch size.
// Internal error if oneDNN fails; throws std::bad_alloc if the packed copy cannot be allocated.
absl::StatusOr<PackedMatrix> PackMatrix(std::span<const float> plain, int64_t rows, int64_t cols,
                                        int64_t ld);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_PACKED_MATRIX_H_
