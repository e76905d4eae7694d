// ProjectionRunner: runs dst[M, N] = src[M, K] · W + bias with a pre-packed W. The source has W's
// element type (f32 or bf16); the destination is f32 or bf16; accumulation and the f32 bias are
// in f32.
//
// oneDNN 2.6 builds a matmul for one M: each primitive JITs its own kernels (~45 KiB resident in
// f32, ~120 KiB in bf16), and a runtime M (DNNL_RUNTIME_DIM_VAL) over packed weights falls back
// to its reference kernel (1,000x slower; over plain weights gemm:jit, 1.1-3.6x slower). So the
// rows run in pieces whose sizes come from a small fixed set (FirstRowPiece), one cached primitive
// per piece size: the primitives a weight ever needs are bounded (≤ 95 for M ≤ 8,192) whatever
// mix of batch sizes arrives, and a split costs no measurable time (each brgemm call streams
// the weights once per block of rows anyway).
//
// Not thread-safe: one per AttentionExecutor. Internal to the core.
#ifndef ATTNSERVE_CORE_FORWARD_PROJECTION_RUNNER_H_
#define ATTNSERVE_CORE_FORWARD_PROJECTION_RUNNER_H_

#include <cstdint>
#include <dnnl.hpp>
#include <span>

#include "absl/status/status.h"
#include "core/forward/onednn_support.h"
#include "core/forward/packed_matrix.h"
#include "core/util/aligned_buffer.h"
#include "core/util/lru_cache.h"

namespace attnserve::core {

// The first piece of `m` (>= 1) rows: m itself below 64, else m rounded down to a multiple of 64
// (of 256 from 1,024 rows, of 1,024 from 4,096). Repeated on what is left, it yields the pieces.
int64_t FirstRowPiece(int64_t m);

class ProjectionRunner {
 public:
  // max_cached_shapes: primitives kept before the least recently used is dropped.
  explicit ProjectionRunner(size_t max_cached_shapes) : cache_(max_cached_shapes) {}

  // dst (M × weights.cols, dense, of dst_type) = src (M × weights.rows, dense, of the weights'
  // type) · weights + bias (empty or weights.cols f32 values). `scratchpad` is grown as oneDNN
  // needs. Internal status on oneDNN failure (dnnl::error does not escape).
  absl::Status Run(const void* src, int64_t m, const PackedMatrix& weights,
                   std::span<const float> bias, void* dst, dnnl::stream& stream,
                   AlignedBuffer& scratchpad,
                   dnnl::memory::data_type dst_type = dnnl::memory::data_type::f32);

  // Primitives held now.
  size_t cached_primitives() const { return cache_.size(); }

 private:
  struct Key {
    int64_t m, k, n;
    bool bias;
    dnnl::memory::data_type src_type, dst_type;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& key) {
      return H::combine(std::move(h), key.m, key.k, key.n, key.bias, key.src_type, key.dst_type);
    }
  };
  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory src, weights, bias, dst, scratchpad;
    size_t scratchpad_bytes = 0;
    ExecArgs args;  // Built once; handles are swapped per call.
  };
  static Entry Build(const Key& key, const PackedMatrix& weights);
  absl::Status RunPiece(const Key& key, const void* src, const PackedMatrix& weights,
                        std::span<const float> bias, void* dst, dnnl::stream& stream,
                        AlignedBuffer& scratchpad);

  LruCache<Key, Entry> cache_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_PROJECTION_RUNNER_H_
