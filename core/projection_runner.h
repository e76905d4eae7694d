// ProjectionRunner: runs dst[M, N] = src[M, K] · W + bias with a pre-packed W, keeping one oneDNN
// matmul primitive per (M, K, N, bias, types) shape in an LRU cache. The source has W's element
// type (f32 or bf16); the destination is f32 or bf16; accumulation and the f32 bias are in f32.
//
// Not thread-safe: one per AttentionExecutor. Internal to the core.
#ifndef ATTNSERVE_CORE_PROJECTION_RUNNER_H_
#define ATTNSERVE_CORE_PROJECTION_RUNNER_H_

#include <cstdint>
#include <dnnl.hpp>
#include <span>

#include "absl/status/status.h"
#include "core/onednn_support.h"
#include "core/packed_matrix.h"
#include "core/util/aligned_buffer.h"
#include "core/util/lru_cache.h"

namespace attnserve::core {

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

  LruCache<Key, Entry> cache_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_PROJECTION_RUNNER_H_
