#include "core/forward/attention_executor.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_tile.h"
#include "core/forward/bf16_conversion.h"
#include "core/forward/finite_values.h"
#include "core/forward/masked_softmax.h"
#include "core/forward/onednn_support.h"
#include "core/forward/projection_runner.h"
#include "core/util/aligned_buffer.h"
#include "core/util/openmp_regions.h"

namespace attnserve::core {
namespace {

// The projected operands of one forward pass: Q rows, K and V rows (row stride kv_ld; for
// self-attention all three are column blocks of one [N, 3d] buffer) and the [N, d] buffer the
// heads are merged into. Strides count elements; Q, K and V are f32 or bf16 (`bf16`), the
// context is bf16 only when bf16 feeds W_O (`context_bf16`).
struct Operands {
  const void* q = nullptr;
  int64_t q_ld = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t kv_ld = 0;
  void* context = nullptr;
  int64_t context_ld = 0;
  bool bf16 = false;
  bool context_bf16 = false;
};

// `base` advanced by `elements` elements of 2 (bf16) or 4 (f32) bytes.
template <typename T>
T* Advance(T* base, int64_t elements, bool bf16) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) + elements * (bf16 ? 2 : 4));
}

dnnl::memory::data_type DataType(bool bf16) {
  return bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// ExecutorOptions::head_tile_bytes, with 0 resolved to its default.
int64_t HeadTileBytes(const ExecutorOptions& options) {
  return options.head_tile_bytes > 0 ? options.head_tile_bytes : int64_t{2} << 20;
}

// Query rows per tile for causal sequences longer than this: small enough to skip most blocked
// keys, large enough to keep the QKᵀ and P·V matmuls efficient (measured: docs/PERFORMANCE.md).
constexpr int64_t kCausalRowBlock = 128;

// A run of consecutive sequences with the same query length t and key length s: they can share
// one batched primitive because their rows sit at a fixed stride.
struct SequenceGroup {
  int64_t count, t, s;
  int64_t q_row, kv_row;  // First query row and first key row of the group.
  int64_t score_offset;   // Σ T_i·S_i of the sequences before the group.
};

// A tile: `batch` sequences from `batch_begin` inside the group, query rows [row_begin, +rows),
// heads [head_begin, +heads) of the model's `model_heads`.
struct TilePlace {
  int64_t batch_begin = 0, row_begin = 0, head_begin = 0, model_heads = 0;
  TileGeometry geometry{};
};

// What one thread needs to attend tiles: its own stream, primitives (their memory objects are
// rebound per call, so they cannot be shared between threads) and buffers.
struct TileWorkspace {
  explicit TileWorkspace(size_t max_cached_shapes)
      : stream(CpuEngine()), tiles(max_cached_shapes) {}
  dnnl::stream stream;
  AttentionTileCache tiles;
  AlignedBuffer scratchpad;     // oneDNN's scratch for the tile's matmuls.
  AlignedBuffer scores;         // One score tile.
  AlignedBuffer probabilities;  // bf16 compute: the tile's bf16 softmax output.
  AlignedBuffer head_major;     // bf16 compute: the tile's dense copies of Q, K and V.

  void EndScratchWindow() {
    for (AlignedBuffer* buffer : {&scratchpad, &scores, &probabilities, &head_major}) {
      buffer->EndWindow();
    }
  }
};

}  // namespace

struct AttentionExecutor::Impl {
  explicit Impl(const ExecutorOptions& o)
      : options(o), stream(CpuEngine()), projections(o.max_cached_shapes) {}

  absl::Status Forward(const AttentionLayer& layer, const AttentionInputs& in,
                       const AttentionOutputs& out);
  absl::Status Compute(const AttentionLayer& layer, const AttentionInputs& in,
                       const AttentionOutputs& out);
  absl::StatusOr<Operands> Project(const AttentionLayer& layer, const AttentionInputs& in);
  absl::Status AttendAll(const AttentionConfig& config, const AttentionInputs& in,
                         const Operands& op, std::span<float> weights);
  absl::Status AttendGroup(const AttentionConfig& config, const AttentionInputs& in,
                           const Operands& op, const SequenceGroup& group,
                           std::span<float> weights);
  absl::Status AttendGroupPerHead(const AttentionConfig& config, const AttentionInputs& in,
                                  const Operands& op, const SequenceGroup& group,
                                  std::span<float> weights);
  absl::Status AttendTile(TileWorkspace& ws, const AttentionInputs& in, const Operands& op,
                          const SequenceGroup& group, const TilePlace& tile,
                          std::span<float> weights, bool parallel);
  void SoftmaxTile(const AttentionInputs& in, const SequenceGroup& group, const TilePlace& tile,
                   float* scores, void* probabilities, bool parallel) const;
  TileWorkspace& Workspace(size_t index);
  void ZeroDisabledHeads(const AttentionInputs& in, const Operands& op, const SequenceGroup& group,
                         const TilePlace& tile) const;
  void CopyWeights(const AttentionInputs& in, const SequenceGroup& group, const TilePlace& tile,
                   const void* probabilities, std::span<float> weights) const;
  // bf16 compute: `rows` × d_model f32 values rounded into `buffer`; returns the bf16 copy.
  const uint16_t* RoundedInput(const float* values, int64_t rows, int64_t d, AlignedBuffer& buffer);
  // Counts one Forward(); every ExecutorOptions::scratch_window_forwards, ends every scratch
  // buffer's window (AlignedBuffer::EndWindow).
  void CountScratchWindow();

  ExecutorOptions options;
  dnnl::stream stream;
  ProjectionRunner projections;
  AlignedBuffer scratchpad;        // oneDNN's scratch for the projections.
  AlignedBuffer projected;         // [N, 3d] self-attention Q|K|V, or [N, d] cross-attention Q.
  AlignedBuffer projected_memory;  // [M, 2d] cross-attention K|V.
  AlignedBuffer context;           // [N, d] merged heads before W_O.
  AlignedBuffer rounded_query;     // bf16 compute: the query rows rounded to bf16.
  AlignedBuffer rounded_memory;    // bf16 compute: the memory rows rounded to bf16.
  // One per OpenMP thread that attends tiles; the first also runs the batched tiles.
  std::vector<std::unique_ptr<TileWorkspace>> workspaces;
  ScratchWindow scratch_window{options.scratch_window_forwards};
};

AttentionExecutor::AttentionExecutor(const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
AttentionExecutor::~AttentionExecutor() = default;

const ExecutorOptions& AttentionExecutor::options() const { return impl_->options; }

absl::Status AttentionExecutor::Forward(const AttentionLayer& layer, const AttentionInputs& in,
                                        const AttentionOutputs& out) {
  if (auto s = ValidateBatch(layer.config(), in, out); !s.ok()) return s;
  try {
    return impl_->Forward(layer, in, out);
  } catch (const dnnl::error& e) {
    return OneDnnError(e, "attention forward");
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("attention forward: out of memory for scratch buffers");
  }
}

absl::Status AttentionExecutor::Impl::Forward(const AttentionLayer& layer,
                                              const AttentionInputs& in,
                                              const AttentionOutputs& out) {
  const OpenMpThreadsScope threads(options.compute_threads);
  absl::Status status = Compute(layer, in, out);
  // fp32 overflow (inputs ~1e20 make QKᵀ infinite) must not come back as an OK answer.
  if (const int64_t bad = status.ok() ? FindNonFinite(out.output) : -1; bad >= 0) {
    const int64_t d = layer.config().d_model;
    status = absl::OutOfRangeError(absl::StrCat(
        "output of sequence ", in.query.SequenceOfRow(bad / d),
        " is not finite: input values too large for fp32 attention (scores overflow)"));
  }
  CountScratchWindow();
  return status;
}

void AttentionExecutor::Impl::CountScratchWindow() {
  if (!scratch_window.CountUse()) return;
  for (AlignedBuffer* buffer :
       {&scratchpad, &projected, &projected_memory, &context, &rounded_query, &rounded_memory}) {
    buffer->EndWindow();
  }
  for (const auto& workspace : workspaces) workspace->EndScratchWindow();
}

absl::Status AttentionExecutor::Impl::Compute(const AttentionLayer& layer,
                                              const AttentionInputs& in,
                                              const AttentionOutputs& out) {
  const AttentionConfig& config = layer.config();
  absl::StatusOr<Operands> op = Project(layer, in);
  if (!op.ok()) return op.status();
  // The single-head variant has no W_O: its one head is written straight into the output.
  const bool has_o = config.HasOutputProjection();
  const int64_t n = in.query.rows(), d = config.d_model;
  op->context = has_o ? context.Reserve(n * d) : out.output.data();
  op->context_ld = d;
  op->context_bf16 = has_o && op->bf16;  // bf16 feeds W_O's bf16 matmul; the API output is f32.
  if (auto s = AttendAll(config, in, *op, out.weights); !s.ok()) return s;
  if (has_o) {
    if (auto s = projections.Run(op->context, n, layer.o(), layer.o_bias(), out.output.data(),
                                 stream, scratchpad);
        !s.ok()) {
      return s;
    }
  }
  stream.wait();
  return absl::OkStatus();
}

// Self-attention: one fused [N, d] · W_QKV. Cross-attention: queries · W_Q and memory · W_KV.
absl::StatusOr<Operands> AttentionExecutor::Impl::Project(const AttentionLayer& layer,
                                                          const AttentionInputs& in) {
  const int64_t d = layer.config().d_model;
  const int64_t n = in.query.rows();
  // bf16: the f32 inputs are rounded once and projected to bf16 Q, K, V (f32 accumulation).
  const bool bf16 = layer.config().compute_type == ComputeType::kBFloat16;
  const dnnl::memory::data_type type = DataType(bf16);
  const void* x = in.query.data.data();
  if (bf16) x = RoundedInput(in.query.data.data(), n, d, rounded_query);
  if (!in.memory) {
    float* qkv = projected.Reserve(n * 3 * d);
    if (auto s =
            projections.Run(x, n, layer.qkv(), layer.qkv_bias(), qkv, stream, scratchpad, type);
        !s.ok()) {
      return s;
    }
    return Operands{.q = qkv,
                    .q_ld = 3 * d,
                    .k = Advance(qkv, d, bf16),
                    .v = Advance(qkv, 2 * d, bf16),
                    .kv_ld = 3 * d,
                    .bf16 = bf16};
  }
  float* q = projected.Reserve(n * d);
  if (auto s = projections.Run(x, n, layer.q(), layer.q_bias(), q, stream, scratchpad, type);
      !s.ok()) {
    return s;
  }
  const int64_t m = in.memory->rows();
  const void* memory = in.memory->data.data();
  if (bf16) memory = RoundedInput(in.memory->data.data(), m, d, rounded_memory);
  float* kv = projected_memory.Reserve(m * 2 * d);
  if (auto s =
          projections.Run(memory, m, layer.kv(), layer.kv_bias(), kv, stream, scratchpad, type);
      !s.ok()) {
    return s;
  }
  return Operands{
      .q = q, .q_ld = d, .k = kv, .v = Advance(kv, d, bf16), .kv_ld = 2 * d, .bf16 = bf16};
}

const uint16_t* AttentionExecutor::Impl::RoundedInput(const float* values, int64_t rows, int64_t d,
                                                      AlignedBuffer& buffer) {
  auto* rounded = reinterpret_cast<uint16_t*>(buffer.Reserve((rows * d + 1) / 2));
  RoundToBf16(values, rows * d, rounded);
  return rounded;
}

// Splits the batch into runs of consecutive sequences with equal (T, S), one group each.
absl::Status AttentionExecutor::Impl::AttendAll(const AttentionConfig& config,
                                                const AttentionInputs& in, const Operands& op,
                                                std::span<float> weights) {
  const RaggedBatch& keys = in.memory ? *in.memory : in.query;
  const int64_t num_sequences = in.query.num_sequences();
  int64_t score_offset = 0;
  for (int64_t first = 0; first < num_sequences;) {
    const int64_t t = in.query.length(first), s = KeyLength(in, first);
    int64_t end = first + 1;
    while (end < num_sequences && in.query.length(end) == t && KeyLength(in, end) == s) ++end;
    const SequenceGroup group{end - first,         t,           s, in.query.offsets[first],
                              keys.offsets[first], score_offset};
    if (auto st = AttendGroup(config, in, op, group, weights); !st.ok()) return st;
    score_offset += group.count * t * s;
    first = end;
  }
  return absl::OkStatus();
}

absl::Status AttentionExecutor::Impl::AttendGroup(const AttentionConfig& config,
                                                  const AttentionInputs& in, const Operands& op,
                                                  const SequenceGroup& group,
                                                  std::span<float> weights) {
  const int64_t h = config.num_heads, t = group.t, s = group.s;
  const int64_t budget = std::max<int64_t>(1, options.score_tile_bytes / int64_t{sizeof(float)});
  // Whole sequences per tile while they fit the budget; otherwise blocks of query rows.
  const int64_t per_sequence = h * t * s;
  // Causal and long enough: blocks of query rows of one sequence let each tile skip the keys
  // after its last query — close to half the QKᵀ and P·V work — and mask only its diagonal block.
  const bool causal_blocks = in.mask.causal && t > kCausalRowBlock;
  const int64_t batch_step =
      causal_blocks ? 1 : std::min(group.count, budget / std::max<int64_t>(1, per_sequence));
  const int64_t row_step = causal_blocks ? kCausalRowBlock : t;
  // Longer sequences: per head and block of query rows, the blocks shared out over the threads.
  if (per_sequence > budget) return AttendGroupPerHead(config, in, op, group, weights);

  for (int64_t b0 = 0; b0 < group.count; b0 += batch_step) {
    const int64_t batch = std::min(batch_step, group.count - b0);
    for (int64_t r0 = 0; r0 < t; r0 += row_step) {
      const int64_t rows = std::min(row_step, t - r0);
      // Causal: keys past the tile's last query are blocked for every row, so skip them.
      const int64_t visible_keys = in.mask.causal ? std::min(s, r0 + rows) : s;
      TilePlace tile{.batch_begin = b0, .row_begin = r0, .model_heads = h};
      tile.geometry = {.batch = batch,
                       .heads = h,
                       .rows = rows,
                       .keys = visible_keys,
                       .head_dim = config.HeadDim(),
                       .q_ld = op.q_ld,
                       .kv_ld = op.kv_ld,
                       .out_ld = op.context_ld,
                       // A lone sequence's batch stride is irrelevant; keep it shape-only so that
                       // equal bf16 tiles of different sequences share one cache entry.
                       .q_batch_stride = (batch > 1 ? t : rows) * op.q_ld,
                       .kv_batch_stride = (batch > 1 ? s : visible_keys) * op.kv_ld,
                       .out_batch_stride = (batch > 1 ? t : rows) * op.context_ld,
                       .bf16 = op.bf16,
                       .out_bf16 = op.context_bf16};
      if (auto st = AttendTile(Workspace(0), in, op, group, tile, weights, /*parallel=*/true);
          !st.ok()) {
        return st;
      }
    }
  }
  return absl::OkStatus();
}

// One tile per (sequence, head, block of query rows), its scores sized by
// ExecutorOptions::head_tile_bytes so that they stay in the caches (L2/L3) from QKᵀ through the
// softmax to P·V and the matmuls keep an M of a few hundred rows. The tiles are
// split over the OpenMP team, each thread running oneDNN single-threaded (oneDNN does not nest
// parallel regions) on its own workspace; a thread takes consecutive tiles, so mostly the same
// head's K and V.
absl::Status AttentionExecutor::Impl::AttendGroupPerHead(const AttentionConfig& config,
                                                         const AttentionInputs& in,
                                                         const Operands& op,
                                                         const SequenceGroup& group,
                                                         std::span<float> weights) {
  const int64_t h = config.num_heads, t = group.t, s = group.s;
  const int64_t block =
      std::clamp<int64_t>(HeadTileBytes(options) / (s * int64_t{sizeof(float)}), 1, t);
  const int64_t blocks = (t + block - 1) / block;
  const int64_t units = group.count * h * blocks;
  const int threads =
      kOwnParallelRegions ? static_cast<int>(std::min<int64_t>(omp_get_max_threads(), units)) : 1;
  for (int i = 0; i < threads; ++i) Workspace(i);
  absl::Status status;
#pragma omp parallel num_threads(threads)
  {
    // oneDNN sizes a primitive's work split by omp_get_max_threads() when it is created; inside
    // this region each primitive runs on one thread, so it must be planned for one. (bf16 brgemm
    // kernels planned for two, then run here on one, computed only part of their output.)
    omp_set_num_threads(1);
    TileWorkspace& ws = *workspaces[omp_get_thread_num()];
    absl::Status local;
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      if (!local.ok()) continue;
      const int64_t r0 = (u % blocks) * block, rows = std::min(block, t - r0);
      const int64_t visible_keys = in.mask.causal ? std::min(s, r0 + rows) : s;
      TilePlace tile{.batch_begin = u / (blocks * h),
                     .row_begin = r0,
                     .head_begin = (u / blocks) % h,
                     .model_heads = h};
      tile.geometry = {.batch = 1,
                       .heads = 1,
                       .rows = rows,
                       .keys = visible_keys,
                       .head_dim = config.HeadDim(),
                       .q_ld = op.q_ld,
                       .kv_ld = op.kv_ld,
                       .out_ld = op.context_ld,
                       .q_batch_stride = rows * op.q_ld,
                       .kv_batch_stride = visible_keys * op.kv_ld,
                       .out_batch_stride = rows * op.context_ld,
                       .bf16 = op.bf16,
                       .out_bf16 = op.context_bf16};
      // Nothing may leave an OpenMP region by exception.
      try {
        local = AttendTile(ws, in, op, group, tile, weights, /*parallel=*/false);
      } catch (const dnnl::error& e) {
        local = OneDnnError(e, "attention tile");
      } catch (const std::bad_alloc&) {
        local = absl::ResourceExhaustedError("attention tile: out of memory for scratch buffers");
      }
    }
#pragma omp critical(attnserve_attend_status)
    if (status.ok() && !local.ok()) status = local;
  }
  return status;
}

TileWorkspace& AttentionExecutor::Impl::Workspace(size_t index) {
  while (workspaces.size() <= index) {
    workspaces.push_back(std::make_unique<TileWorkspace>(options.max_cached_shapes));
  }
  return *workspaces[index];
}

// `parallel`: spread the softmax over the OpenMP team (false when already inside one).
absl::Status AttentionExecutor::Impl::AttendTile(TileWorkspace& ws, const AttentionInputs& in,
                                                 const Operands& op, const SequenceGroup& group,
                                                 const TilePlace& tile, std::span<float> weights,
                                                 bool parallel) {
  const TileGeometry& g = tile.geometry;
  absl::StatusOr<AttentionTile*> primitives = ws.tiles.Get(g, ws.scratchpad, ws.head_major);
  if (!primitives.ok()) return primitives.status();
  AttentionTile& p = **primitives;
  float* tile_scores = ws.scores.Reserve(g.score_elements());
  const int64_t q_row = group.q_row + tile.batch_begin * group.t + tile.row_begin;
  const int64_t kv_row = group.kv_row + tile.batch_begin * group.s;
  const int64_t column = tile.head_begin * g.head_dim;  // Heads are column blocks of d_k.

  // f32: softmax in place; bf16: f32 scores in, bf16 probabilities out.
  void* tile_probabilities =
      g.bf16 ? ws.probabilities.Reserve((g.score_elements() + 1) / 2) : tile_scores;
  p.Scores(ws.stream, g, Advance(op.q, q_row * op.q_ld + column, op.bf16),
           Advance(op.k, kv_row * op.kv_ld + column, op.bf16), tile_scores, ws.scratchpad.data(),
           ws.head_major.data());
  SoftmaxTile(in, group, tile, tile_scores, tile_probabilities, parallel);
  p.Values(ws.stream, g, tile_probabilities, Advance(op.v, kv_row * op.kv_ld + column, op.bf16),
           Advance(op.context, q_row * op.context_ld + column, op.context_bf16),
           ws.scratchpad.data(), ws.head_major.data());
  if (!in.head_mask.empty()) ZeroDisabledHeads(in, op, group, tile);
  if (!weights.empty()) CopyWeights(in, group, tile, tile_probabilities, weights);
  return absl::OkStatus();
}

// Masks and softmaxes every score row of the tile in one pass per row (MaskedSoftmaxRow), the
// rows split over the OpenMP team that runs oneDNN's primitives. Blocked keys and rows with no
// visible key come out as exact zeros.
void AttentionExecutor::Impl::SoftmaxTile(const AttentionInputs& in, const SequenceGroup& group,
                                          const TilePlace& tile, float* tile_scores,
                                          void* tile_probabilities, bool parallel) const {
  const TileGeometry& g = tile.geometry;
  const uint8_t* explicit_mask =
      in.mask.explicit_mask.empty() ? nullptr : in.mask.explicit_mask.data();
  const bool causal = in.mask.causal;
  uint16_t* bf16_out = g.bf16 ? static_cast<uint16_t*>(tile_probabilities) : nullptr;
  const int64_t total_rows = g.batch * g.heads * g.rows;
#pragma omp parallel for schedule(static) if (parallel && kOwnParallelRegions)
  for (int64_t r = 0; r < total_rows; ++r) {
    const int64_t i = r % g.rows, b = r / (g.heads * g.rows);
    const int64_t query = tile.row_begin + i;
    RowMask mask{.visible_limit = causal ? query + 1 : g.keys};
    if (explicit_mask != nullptr) {
      mask.explicit_row = explicit_mask + group.score_offset +
                          (tile.batch_begin + b) * group.t * group.s + query * group.s;
    }
    MaskedSoftmaxRow(tile_scores + r * g.keys, g.keys, mask,
                     bf16_out == nullptr ? nullptr : bf16_out + r * g.keys);
  }
}

void AttentionExecutor::Impl::ZeroDisabledHeads(const AttentionInputs& in, const Operands& op,
                                                const SequenceGroup& group,
                                                const TilePlace& tile) const {
  const TileGeometry& g = tile.geometry;
  for (int64_t head = tile.head_begin; head < tile.head_begin + g.heads; ++head) {
    if (in.head_mask[head]) continue;
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t i = 0; i < g.rows; ++i) {
        const int64_t row = group.q_row + (tile.batch_begin + b) * group.t + tile.row_begin + i;
        void* out = Advance(op.context, row * op.context_ld + head * g.head_dim, op.context_bf16);
        std::memset(out, 0, g.head_dim * (op.context_bf16 ? 2 : 4));
      }
    }
  }
}

// Copies the tile's probabilities into the caller's [h, T, S] blocks (bf16 ones widened
// exactly); keys the causal tile skipped and disabled heads are written as zeros.
void AttentionExecutor::Impl::CopyWeights(const AttentionInputs& in, const SequenceGroup& group,
                                          const TilePlace& tile, const void* tile_probabilities,
                                          std::span<float> weights) const {
  const TileGeometry& g = tile.geometry;
  const int64_t t = group.t, s = group.s;
  for (int64_t b = 0; b < g.batch; ++b) {
    float* sequence =
        weights.data() + tile.model_heads * (group.score_offset + (tile.batch_begin + b) * t * s);
    for (int64_t head = 0; head < g.heads; ++head) {
      const int64_t model_head = tile.head_begin + head;
      const bool enabled = in.head_mask.empty() || in.head_mask[model_head];
      for (int64_t i = 0; i < g.rows; ++i) {
        float* dst = sequence + (model_head * t + tile.row_begin + i) * s;
        const int64_t first = ((b * g.heads + head) * g.rows + i) * g.keys;
        if (enabled && g.bf16) {
          WidenBf16(static_cast<const uint16_t*>(tile_probabilities) + first, g.keys, dst);
          std::fill(dst + g.keys, dst + s, 0.0f);
        } else if (enabled) {
          const float* src = static_cast<const float*>(tile_probabilities) + first;
          std::copy(src, src + g.keys, dst);
          std::fill(dst + g.keys, dst + s, 0.0f);
        } else {
          std::fill(dst, dst + s, 0.0f);
        }
      }
    }
  }
}

}  // namespace attnserve::core
