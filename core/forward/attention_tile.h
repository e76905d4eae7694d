// AttentionTile: the two oneDNN matmuls that attend one tile of queries — `batch` sequences
// × `heads` heads × `rows` query rows against `keys` keys — over strided views of the projection
// buffers, so that splitting into heads and merging them back costs no copy:
//   scores [batch, heads, rows, keys] (dense) = Q Kᵀ · 1/√d_k   (output-scale attribute)
//   out [batch, heads, rows, d_k] (strided into the concat buffer) = probabilities · V
// The caller masks the scores and turns them into probabilities in between (MaskedSoftmaxRow,
// one fused pass per row: faster than oneDNN's softmax plus separate masking passes).
// With `bf16` set, Q, K and V are bf16, the scores stay f32, the probabilities are bf16 in a
// separate buffer, P·V accumulates in f32 and writes `out_bf16` ? bf16 : f32.
//
// bf16 is the one place where the heads are copied: oneDNN 2.6 runs a bf16 matmul over strided
// per-head views with its generic gemm (gemm:jit), 20-30x slower than the brgemm (AMX /
// AVX512-BF16) kernel it picks for dense operands — QKᵀ of 8 heads x 128 x 128 took 0.73 ms
// against 0.023 ms, while copying Q, K and V head-major costs ~0.003 ms each (measured with both
// layouts on this machine; docs/PERFORMANCE.md, "bf16 attention over dense heads"). So bf16 tiles
// first copy their Q, K and V views into dense [batch, heads, rows, d_k] buffers in the space
// the caller gives (head_major_bytes()), shared over the OpenMP team when the tile is large and
// the caller is not already in a parallel region. fp32 matmuls run as fast on the strided views
// (gemm:jit either way), so f32 tiles copy nothing.
//
// Per-shape state: an f32 tile is built once per (heads, d_k) with every other dimension and
// stride a runtime value (DNNL_RUNTIME_DIM_VAL), and takes the call's geometry at each step, so
// a server that sees every sequence length keeps a handful of f32 tiles, not one (~30 KiB of
// primitives) per length pair. gemm:jit, the kernel f32 tiles run on strided views in any case,
// takes runtime shapes; describing the operands per call (C API structs, no allocation in this
// code) costs nothing measurable on the core bench's shapes (docs/PERFORMANCE.md). bf16 tiles stay
// one per geometry: the brgemm kernels they need are generated for one shape.
//
// AttentionTileCache keeps the tiles, least recently used dropped first. Not thread-safe.
// Internal to the core.
#ifndef ATTNSERVE_CORE_FORWARD_ATTENTION_TILE_H_
#define ATTNSERVE_CORE_FORWARD_ATTENTION_TILE_H_

#include <cstdint>
#include <dnnl.hpp>

#include "absl/status/statusor.h"
#include "core/forward/onednn_support.h"
#include "core/util/aligned_buffer.h"
#include "core/util/lru_cache.h"

namespace attnserve::core {

// Where a tile's operands live. Q row r, head h starts at q + r·q_ld + h·head_dim; K and V
// likewise with kv_ld; the output with out_ld. The batch strides step from one sequence to the
// next inside the tile.
struct TileGeometry {
  int64_t batch = 0, heads = 0, rows = 0, keys = 0, head_dim = 0;
  int64_t q_ld = 0, kv_ld = 0, out_ld = 0;
  int64_t q_batch_stride = 0, kv_batch_stride = 0, out_batch_stride = 0;
  bool bf16 = false;      // Q, K, V and the probabilities are bf16.
  bool out_bf16 = false;  // The P·V output is bf16 (only with bf16).

  int64_t score_elements() const { return batch * heads * rows * keys; }
  bool operator==(const TileGeometry&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const TileGeometry& g) {
    return H::combine(std::move(h), g.batch, g.heads, g.rows, g.keys, g.head_dim, g.q_ld, g.kv_ld,
                      g.out_ld, g.q_batch_stride, g.kv_batch_stride, g.out_batch_stride, g.bf16,
                      g.out_bf16);
  }
};

class AttentionTile {
 public:
  // Builds the primitives for `g` (f32: for any geometry with g's heads, head_dim and out_bf16),
  // planned for the calling thread's OpenMP team size; throws dnnl::error (caught by the cache).
  explicit AttentionTile(const TileGeometry& g);

  // Whether this tile runs `g` (f32: any batch, rows, keys and strides; bf16: exactly g).
  bool Serves(const TileGeometry& g) const;

  // Largest scratchpad either primitive needs, in bytes.
  size_t scratchpad_bytes() const { return scratchpad_bytes_; }
  // Bytes of the head-major copies of Q, K and V a bf16 tile makes; 0 for f32.
  size_t head_major_bytes() const { return head_major_bytes_; }

  // Each step runs synchronously on the CPU stream for geometry `g`, which the tile must serve.
  // `scratch` holds scratchpad_bytes(), `head_major` head_major_bytes() (64-byte aligned; the
  // same buffer for both steps of a tile, or null when head_major_bytes() is 0). Pointers are to
  // elements of the types the geometry names; `probabilities` are f32 (the scores buffer, in
  // place) or bf16 (g.score_elements() of them). Throws dnnl::error.
  void Scores(dnnl::stream& stream, const TileGeometry& g, const void* q, const void* k,
              float* scores, void* scratch, void* head_major);
  void Values(dnnl::stream& stream, const TileGeometry& g, const void* probabilities, const void* v,
              void* out, void* scratch, void* head_major);

 private:
  struct Step {
    dnnl::primitive primitive;
    dnnl::memory scratchpad;
    ExecArgs args;  // Built once; handles are swapped per call.
  };
  // Where one operand's bf16 rows are read from (strides in elements) and where its dense
  // head-major copy goes (bf16 only).
  struct Copy {
    int64_t batch_stride = 0, ld = 0, rows = 0;
    size_t offset = 0;  // In the head-major buffer, in bytes.
  };
  void RunStep(dnnl::stream& stream, Step& step, void* scratch);
  // f32: runs `step`'s runtime-shaped primitive on operands described for this call's geometry.
  void RunRuntimeStep(dnnl::stream& stream, Step& step, const dnnl_memory_desc_t& src,
                      const void* src_data, const dnnl_memory_desc_t& weights,
                      const void* weights_data, const dnnl_memory_desc_t& dst, void* dst_data,
                      void* scratch);
  // Copies the operand at `from` head-major into its place in `head_major`; returns that place.
  void* CopyHeads(const Copy& copy, const void* from, void* head_major) const;

  TileGeometry geometry_;
  bool runtime_shape_ = false;  // f32: dimensions and strides come with each call.
  dnnl::memory q_, k_, scores_, probabilities_, v_, out_;
  Step scores_step_, values_step_;
  Copy q_copy_, k_copy_, v_copy_;
  size_t scratchpad_bytes_ = 0;
  size_t head_major_bytes_ = 0;
};

class AttentionTileCache {
 public:
  // max_cached_shapes: tiles kept before the least recently used is dropped.
  explicit AttentionTileCache(size_t max_cached_shapes) : cache_(max_cached_shapes) {}

  // A tile that serves `g`, built on first use for the calling thread's OpenMP team size (tiles
  // used inside a parallel region and outside one are kept apart: a primitive planned for two
  // threads computes part of its output on one); `scratchpad` and `head_major` are grown to what
  // it needs for `g`. Internal status if oneDNN cannot build it.
  absl::StatusOr<AttentionTile*> Get(const TileGeometry& g, AlignedBuffer& scratchpad,
                                     AlignedBuffer& head_major);

  // Tiles held now.
  size_t size() const { return cache_.size(); }

 private:
  struct Key {
    TileGeometry shape;  // f32: only heads, head_dim and out_bf16 set.
    int team_threads;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& key) {
      return H::combine(std::move(h), key.shape, key.team_threads);
    }
  };
  LruCache<Key, AttentionTile> cache_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_ATTENTION_TILE_H_
