// AttentionExecutor: runs forward passes of AttentionLayers over ragged batches on oneDNN.
//
// One executor per compute thread: it owns the per-shape oneDNN primitive caches and the scratch
// buffers, so it is NOT thread-safe; any number of executors may share one AttentionLayer. After
// a warm-up call with the same shapes, Forward() does no heap allocation of its own (until a
// scratch window ends with buffers far larger than recent calls needed: see
// ExecutorOptions::scratch_window_forwards).
//
// What one Forward() does (multi-head; the single-head variant skips the last step):
//   1. one fused projection over all rows: [N, d] · W_QKV → [N, 3d]   (cross-attention: queries ·
//      W_Q and memory · W_KV);
//   2. per tile of sequences × query rows: scaled QKᵀ over strided head views, mask, softmax, and
//      P·V written straight into the [N, d] concat buffer (see attention_tile.h);
//   3. one output projection over all rows: concat · W_O.
#ifndef ATTNSERVE_CORE_FORWARD_ATTENTION_EXECUTOR_H_
#define ATTNSERVE_CORE_FORWARD_ATTENTION_EXECUTOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_layer.h"

namespace attnserve::core {

struct ExecutorOptions {
  // OpenMP threads oneDNN uses inside each Forward() (set on the calling thread, which becomes
  // the OpenMP master, and restored when Forward() returns). 0 keeps the calling thread's
  // setting: OMP_NUM_THREADS, else one per core, unless the caller changed it. The caller's
  // own threads share the same cores: budget compute_threads + other busy threads <= cores, and
  // run with OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000 so idle OpenMP workers spin only
  // briefly (keeping back-to-back primitives fast) and then sleep instead of stealing the cores
  // (docs/ARCHITECTURE.md, "Threads").
  int compute_threads = 0;
  // Target size of one tile of attention scores, in bytes (batch·heads·rows·keys·4); a tile
  // holds at least one query row of every head (heads·keys·4 bytes) even if that is more. Long
  // sequences are attended in blocks of query rows so the score tile stays within the last-level
  // cache instead of growing as h·T² (134 MB at T = 2048, h = 8). Smaller tiles shrink the
  // matmuls' M and cost throughput; 8 MiB measured best on the reference machine, within 2 % of
  // 16 MiB and 2.5x faster than 256 KiB (docs/PERFORMANCE.md).
  int64_t score_tile_bytes = int64_t{8} << 20;
  // Sequences whose h·T·S scores exceed score_tile_bytes are attended per head and block of
  // query rows instead, the blocks shared out over the compute threads. This is the target size
  // of one such block's scores (rows·S·4 bytes); 0 means the default, 2 MiB (256 rows at
  // S = 2048). Measured on the reference machine (`BM_HeadTileSize`, docs/PERFORMANCE.md): 1 to
  // 8 MiB are within a few per cent, 512 KiB (a block that stays in a core's L2) is ~15 % slower,
  // as the matmuls' M shrinks.
  int64_t head_tile_bytes = 0;
  // oneDNN primitives kept per kind (projections, attention tiles) before the least recently
  // used is dropped (~50 µs to create one again). Projections run their rows in pieces from a
  // fixed set of sizes, so they need at most 95 per weight matrix for up to 8,192 rows whatever
  // the batch sizes; attention tiles need one per (sequences, rows, keys) shape.
  size_t max_cached_shapes = 512;
  // Scratch memory follows recent batches, not the largest since start: every this many
  // Forward() calls, each scratch buffer holding over twice what the largest of those calls
  // needed (and at least 1 MiB) is freed, to be allocated again at the size then needed. One
  // batch of 8,192 rows grows the Q|K|V buffer alone to 48 MiB at d_model 512; without this it
  // would stay resident until exit. 0 = never free (buffers only grow).
  int scratch_window_forwards = 128;
};

class AttentionExecutor {
 public:
  explicit AttentionExecutor(const ExecutorOptions& options = {});
  ~AttentionExecutor();
  AttentionExecutor(const AttentionExecutor&) = delete;
  AttentionExecutor& operator=(const AttentionExecutor&) = delete;

  // Computes `layer` on `in`, writing out.output and, when non-empty, out.weights.
  // InvalidArgument (naming the field, expected and received values) when `in`/`out` do not fit
  // the layer's config or an input value is not finite; OutOfRange when the output is not finite
  // (inputs so large that fp32 scores overflow, ~1e19 and up); Internal if oneDNN fails;
  // ResourceExhausted if scratch memory cannot be allocated. On error the outputs are
  // unspecified; the executor stays usable.
  absl::Status Forward(const AttentionLayer& layer, const AttentionInputs& in,
                       const AttentionOutputs& out);

  const ExecutorOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_ATTENTION_EXECUTOR_H_
