// ProjectionRunner: runs dst[M, N] = src[M, K] · W + bias with a pre-packed W, keeping one oneDNN
// matmul primitive per (M, K, N, bias) shape in an LRU cache.
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

  // dst (M × weights.cols, dense) = src (M × weights.rows, dense) · weights + bias (empty or
  // weights.cols values). `scratchpad` is grown as oneDNN needs. Internal status on oneDNN failure
  // (dnnl::error does not escape).
  absl::Status Run(const float* src, int64_t m, const PackedMatrix& weights,
                   std::span<const float> bias, float* dst, dnnl::stream& stream,
                   AlignedBuffer& scratchpad);

 private:
  struct Key {
    int64_t m, k, n;
    bool bias;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& key) {
      return H::combine(std::move(h), key.m, key.k, key.n, key.bias);
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
