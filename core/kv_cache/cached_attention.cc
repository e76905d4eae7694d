#include "core/kv_cache/cached_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/forward/bf16_conversion.h"
#include "core/forward/finite_values.h"
#include "core/forward/onednn_support.h"
#include "core/forward/projection_runner.h"
#include "core/kv_cache/paged_attention.h"
#include "core/util/aligned_buffer.h"
#include "core/util/openmp_regions.h"

namespace attnserve::core {
namespace {

// Most query rows of one sequence and head per AttendRows call: a prefill chunk's 256 in one
// call, and a long uncached sequence's [rows, keys] probabilities scratch bounded.
constexpr int64_t kRowTile = 256;

// Where one sequence's attention reads and writes.
struct SequencePlan {
  int64_t q_row = 0;     // First new row in the batch.
  int64_t rows = 0;      // T_i.
  int64_t past = 0;      // Keys before the first new query (P_i; the memory length for cross).
  int64_t keys = 0;      // S_i.
  int64_t scores = 0;    // Σ T·S of the sequences before it (mask and weights offset / h).
  int64_t segment = 0;   // First KvSegment of head 0 in the flat segment list.
  int64_t segments = 0;  // Segments per head.
  bool causal = false;
  const KvSequence* cache = nullptr;  // Null: the keys are the sequence's own projected rows.
};

// Validates the memory batch of LoadMemory (the query batch goes through ValidateBatch).
absl::Status ValidateMemory(const RaggedBatch& memory, int64_t d) {
  if (memory.offsets.size() < 2 || memory.offsets[0] != 0) {
    return absl::InvalidArgumentError("memory.offsets: expected at least 2 entries starting at 0");
  }
  for (size_t i = 1; i < memory.offsets.size(); ++i) {
    if (memory.offsets[i] <= memory.offsets[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory.offsets: expected strictly increasing values, entry ", i, " is ",
                       memory.offsets[i], " after ", memory.offsets[i - 1]));
    }
  }
  if (static_cast<int64_t>(memory.data.size()) != memory.rows() * d) {
    return absl::InvalidArgumentError(absl::StrCat("memory.data: expected ", memory.rows(), " x ",
                                                   d, " floats, got ", memory.data.size()));
  }
  if (const int64_t bad = FindNonFinite(memory.data); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory.data: value ", bad, " is not finite"));
  }
  return absl::OkStatus();
}

// bf16 compute: `rows` × `d` floats rounded into `buffer`, the bf16 source a bf16 matmul reads.
const uint16_t* Rounded(const float* values, int64_t rows, int64_t d, AlignedBuffer& buffer) {
  auto* rounded = reinterpret_cast<uint16_t*>(buffer.Reserve((rows * d + 1) / 2));
  RoundToBf16(values, rows * d, rounded);
  return rounded;
}

// InvalidArgument unless every non-null entry of `caches` is distinct.
absl::Status CheckDistinct(std::span<KvSequence* const> caches) {
  std::vector<KvSequence*> sorted;
  for (KvSequence* c : caches) {
    if (c != nullptr) sorted.push_back(c);
  }
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("caches: a sequence's cache appears more than once");
  }
  return absl::OkStatus();
}

}  // namespace

struct CachedAttentionExecutor::Impl {
  explicit Impl(const ExecutorOptions& o)
      : options(o), stream(CpuEngine()), projections(o.max_cached_shapes) {}

  absl::Status Validate(const AttentionLayer& layer, const KvBlockPool& pool,
                        const CachedAttentionInputs& in, const AttentionOutputs& out);
  absl::Status ReserveAll(KvBlockPool& pool, std::span<KvSequence* const> caches,
                          const RaggedBatch& rows);
  absl::Status Run(const AttentionLayer& layer, KvBlockPool& pool, const CachedAttentionInputs& in,
                   const AttentionOutputs& out);
  void Plan(const KvBlockPool& pool, const CachedAttentionInputs& in);
  absl::Status Attend(const AttentionConfig& config, const KvBlockPool& pool,
                      const CachedAttentionInputs& in, const float* q, int64_t q_ld, float* context,
                      std::span<float> weights);
  absl::Status Load(const AttentionLayer& layer, KvBlockPool& pool, const RaggedBatch& memory,
                    std::span<KvSequence* const> caches);

  ExecutorOptions options;
  dnnl::stream stream;
  ProjectionRunner projections;
  AlignedBuffer scratchpad, projected, context;
  AlignedBuffer rounded;  // bf16 compute: a bf16 copy of a projection's f32 source.
  // One per OpenMP thread: the probabilities of one (sequence, head), and AttendRows' K and V.
  std::vector<AlignedBuffer> probabilities, keys, values;
  std::vector<SequencePlan> plans;
  std::vector<KvSegment> segments;  // Per sequence, per head: its key runs.
  // Attend walks the (sequence, head) items backwards when set, and flips it on every call, so
  // that the K/V one forward read last are the first the next one reads, while still cached.
  // Decode steps reread the same sequences' K/V every iteration; in one fixed order, a working
  // set a little above what the L3 keeps misses on most lines, each evicted before its turn
  // comes round again (BM_MemoryRead on the development VM: 16 MiB reads at L3 speed, 24 MiB at
  // half of it). Measured there: BM_DecodeBatched/B:64/P:128 bf16 (16.8 MB of K/V) ~15 % faster,
  // fp32 (33.6 MB, well above) unchanged (docs/PERFORMANCE.md).
  bool backwards = false;
  ScratchWindow scratch_window{options.scratch_window_forwards};

  // Every ExecutorOptions::scratch_window_forwards calls, frees scratch far larger than those
  // calls needed (AlignedBuffer::EndWindow): a long prompt's chunk must not keep its buffers.
  void CountScratchWindow() {
    if (!scratch_window.CountUse()) return;
    for (AlignedBuffer* buffer : {&scratchpad, &projected, &context, &rounded}) buffer->EndWindow();
    for (auto* per_thread : {&probabilities, &keys, &values}) {
      for (AlignedBuffer& buffer : *per_thread) buffer.EndWindow();
    }
  }
};

CachedAttentionExecutor::CachedAttentionExecutor(const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
CachedAttentionExecutor::~CachedAttentionExecutor() = default;

absl::Status CachedAttentionExecutor::Impl::Validate(const AttentionLayer& layer,
                                                     const KvBlockPool& pool,
                                                     const CachedAttentionInputs& in,
                                                     const AttentionOutputs& out) {
  const AttentionConfig& config = layer.config();
  if (auto s = pool.CheckIdentity(config); !s.ok()) return s;
  // Query rows, output size, head mask and finiteness, as for an uncached forward.
  const AttentionInputs plain{.query = in.query, .head_mask = in.head_mask};
  if (auto s = ValidateBatch(config, plain, {.output = out.output}); !s.ok()) return s;
  const int64_t b = in.query.num_sequences();
  if (static_cast<int64_t>(in.caches.size()) != b) {
    return absl::InvalidArgumentError(
        absl::StrCat("caches: expected one entry per sequence (", b, "), got ", in.caches.size()));
  }
  if (auto s = CheckDistinct(in.caches); !s.ok()) return s;
  int64_t scores = 0;
  for (int64_t i = 0; i < b; ++i) {
    const KvSequence* c = in.caches[i];
    if (in.cross_attention && (c == nullptr || c->length == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "caches[", i, "]: cross-attention needs the sequence's memory loaded (LoadMemory)"));
    }
    const int64_t past = c == nullptr ? 0 : c->length;
    scores += in.query.length(i) * (in.cross_attention ? past : past + in.query.length(i));
  }
  if (in.cross_attention && in.mask.causal) {
    return absl::InvalidArgumentError("mask.causal: must be false for cached cross-attention");
  }
  if (!in.mask.explicit_mask.empty() &&
      static_cast<int64_t>(in.mask.explicit_mask.size()) != scores) {
    return absl::InvalidArgumentError(absl::StrCat("mask.explicit_mask: expected ", scores,
                                                   " bytes (Σ T_i·S_i), got ",
                                                   in.mask.explicit_mask.size()));
  }
  if (!out.weights.empty() &&
      static_cast<int64_t>(out.weights.size()) != scores * config.num_heads) {
    return absl::InvalidArgumentError(absl::StrCat("weights: expected ", scores * config.num_heads,
                                                   " floats (num_heads·Σ T_i·S_i), got ",
                                                   out.weights.size()));
  }
  return absl::OkStatus();
}

// Reserves rows.length(i) tokens in every non-null caches[i]; all or nothing.
absl::Status CachedAttentionExecutor::Impl::ReserveAll(KvBlockPool& pool,
                                                       std::span<KvSequence* const> caches,
                                                       const RaggedBatch& rows) {
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] == nullptr) continue;
    if (auto s = pool.Reserve(*caches[i], rows.length(static_cast<int64_t>(i))); !s.ok()) {
      for (size_t j = 0; j < i; ++j) {
        if (caches[j] != nullptr) pool.Trim(*caches[j]);
      }
      return absl::Status(s.code(), absl::StrCat("sequence ", i, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CachedAttentionExecutor::Forward(const AttentionLayer& layer, KvBlockPool& pool,
                                              const CachedAttentionInputs& in,
                                              const AttentionOutputs& out) {
  if (auto s = impl_->Validate(layer, pool, in, out); !s.ok()) return s;
  if (!in.cross_attention) {
    if (auto s = impl_->ReserveAll(pool, in.caches, in.query); !s.ok()) return s;
  }
  absl::Status status;
  try {
    const OpenMpThreadsScope threads(impl_->options.compute_threads);
    status = impl_->Run(layer, pool, in, out);
  } catch (const dnnl::error& e) {
    status = OneDnnError(e, "cached attention forward");
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("cached attention forward: out of memory for scratch");
  }
  for (size_t i = 0; i < in.caches.size(); ++i) {
    KvSequence* c = in.caches[i];
    if (c == nullptr || in.cross_attention) continue;
    if (status.ok()) {
      pool.Commit(*c, c->length + in.query.length(static_cast<int64_t>(i)));
    } else {
      pool.Trim(*c);  // Rows written past the length are simply forgotten.
    }
  }
  impl_->CountScratchWindow();
  return status;
}

absl::Status CachedAttentionExecutor::Impl::Run(const AttentionLayer& layer, KvBlockPool& pool,
                                                const CachedAttentionInputs& in,
                                                const AttentionOutputs& out) {
  const AttentionConfig& config = layer.config();
  const int64_t n = in.query.rows(), d = config.d_model;
  const bool bf16 = config.compute_type == ComputeType::kBFloat16;
  // bf16 compute (as AttentionExecutor): the f32 rows are rounded to bf16 for the bf16 weights.
  const void* x = in.query.data.data();
  if (bf16) x = Rounded(in.query.data.data(), n, d, rounded);
  // 1. One projection over every new row of the batch.
  const int64_t q_ld = in.cross_attention ? d : 3 * d;
  float* qkv = projected.Reserve(n * q_ld);
  const PackedMatrix& w = in.cross_attention ? layer.q() : layer.qkv();
  const auto bias = in.cross_attention ? layer.q_bias() : layer.qkv_bias();
  if (auto s = projections.Run(x, n, w, bias, qkv, stream, scratchpad); !s.ok()) return s;
  stream.wait();
  // The full bf16 forward projects into bf16 Q, K and V; rounding the f32 projection once gives
  // the same values, so the new rows' queries and keys (and an uncached sequence's K and V, read
  // from this buffer) are what a full forward of the whole sequence would use.
  if (bf16) RoundToBf16InPlace(qkv, n * q_ld);
  // 2. Append K and V of the new rows to the cached sequences (past their committed length).
  if (!in.cross_attention) {
    for (int64_t i = 0; i < in.query.num_sequences(); ++i) {
      if (in.caches[i] == nullptr) continue;
      const float* rows = qkv + in.query.offsets[i] * q_ld;
      pool.Write(*in.caches[i], in.query.length(i), rows + d, q_ld, rows + 2 * d, q_ld);
    }
  }
  // 3. Attention of every new query over its sequence's keys.
  Plan(pool, in);
  const bool has_o = config.HasOutputProjection();
  float* ctx = has_o ? context.Reserve(n * d) : out.output.data();
  if (auto s = Attend(config, pool, in, qkv, q_ld, ctx, out.weights); !s.ok()) return s;
  // 4. Output projection over every row (bf16 compute: the context rounded to bf16 for W_O, as
  // the full forward's bf16 P·V output is).
  if (has_o) {
    const void* c = bf16 ? static_cast<const void*>(Rounded(ctx, n, d, rounded)) : ctx;
    if (auto s =
            projections.Run(c, n, layer.o(), layer.o_bias(), out.output.data(), stream, scratchpad);
        !s.ok()) {
      return s;
    }
    stream.wait();
  }
  if (const int64_t bad = FindNonFinite(out.output); bad >= 0) {
    return absl::OutOfRangeError(absl::StrCat(
        "output of sequence ", in.query.SequenceOfRow(bad / d),
        " is not finite: input values too large for fp32 attention (scores overflow)"));
  }
  return absl::OkStatus();
}

// Plans, per sequence, where its attention reads and writes, and makes room in `segments` for
// the runs of keys each of its heads reads (FillSegments lists them, per item, inside Attend's
// parallel loop: listed here, one thread wrote every segment while the other waited, ~6 % of a
// one-sequence step over 2,048 cached tokens).
void CachedAttentionExecutor::Impl::Plan(const KvBlockPool& pool, const CachedAttentionInputs& in) {
  const int64_t b = in.query.num_sequences(), h = pool.identity().num_heads;
  const int64_t bt = pool.options().block_tokens;
  plans.resize(b);
  int64_t scores = 0, segment = 0;
  for (int64_t i = 0; i < b; ++i) {
    const KvSequence* c = in.caches[i];
    SequencePlan& p = plans[i];
    p.q_row = in.query.offsets[i];
    p.rows = in.query.length(i);
    p.past = c == nullptr ? 0 : c->length;
    p.keys = in.cross_attention ? p.past : p.past + p.rows;
    p.scores = scores;
    p.segment = segment;
    p.causal = in.mask.causal;
    p.cache = c;
    p.segments = c == nullptr ? 1 : (p.keys + bt - 1) / bt;
    scores += p.rows * p.keys;
    segment += h * p.segments;
  }
  // Grown only: the entries are written before they are read.
  if (static_cast<int64_t>(segments.size()) < segment) segments.resize(segment);
}

namespace {

// Lists the runs of keys `head` of `p` reads into out[0, p.segments): the sequence's blocks for a
// cached one, its own projected rows (qkv, row stride 3 · d) otherwise.
void FillSegments(const KvBlockPool& pool, const SequencePlan& p, int64_t head, const float* qkv,
                  KvSegment* out) {
  const int64_t d = pool.identity().d_model, dk = pool.head_dim();
  if (p.cache == nullptr) {
    const float* rows = qkv + p.q_row * 3 * d;
    *out = {.k = rows + d + head * dk,
            .v = rows + 2 * d + head * dk,
            .count = p.rows,
            .ld = 3 * d,
            .type = KvElementType::kFloat32};
    return;
  }
  const int64_t bt = pool.options().block_tokens;
  const KvElementType type = pool.element_type();
  const int64_t int8_block_rows = type == KvElementType::kInt8 ? bt : 0;
  for (int64_t blk = 0; blk < p.segments; ++blk) {
    const int32_t id = p.cache->blocks[blk];
    out[blk] = {.k = pool.key_data(id, head),
                .v = pool.value_data(id, head),
                .count = std::min(bt, p.keys - blk * bt),
                .ld = dk,
                .type = type,
                .k_scale = pool.key_scales(id, head),
                .v_scale = pool.value_scales(id, head),
                .int8_block_rows = int8_block_rows};
  }
}

}  // namespace

absl::Status CachedAttentionExecutor::Impl::Attend(const AttentionConfig& config,
                                                   const KvBlockPool& pool,
                                                   const CachedAttentionInputs& in, const float* q,
                                                   int64_t q_ld, float* ctx,
                                                   std::span<float> weights) {
  const int64_t h = config.num_heads, dk = config.HeadDim(), d = config.d_model;
  const int64_t items = static_cast<int64_t>(plans.size()) * h;
  int64_t max_keys = 0, max_scores = 0;
  for (const SequencePlan& p : plans) {
    max_keys = std::max(max_keys, p.keys);
    max_scores = std::max(max_scores, std::min(p.rows, kRowTile) * p.keys);
  }
  const int threads = omp_get_max_threads();
  if (static_cast<int>(probabilities.size()) < threads) {
    probabilities.resize(threads);
    keys.resize(threads);
    values.resize(threads);
  }
  for (int t = 0; t < threads; ++t) {
    probabilities[t].Reserve(max_scores);
    keys[t].Reserve(max_keys * dk);
    values[t].Reserve(max_keys * dk);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  int64_t kv_bytes = 0;  // What this forward's decode rows read: K and V of every key.
  for (const SequencePlan& p : plans) {
    if (p.rows == 1 && p.segments > 0) {
      const KvElementType type = p.cache == nullptr ? KvElementType::kFloat32 : pool.element_type();
      kv_bytes += 2 * p.keys * d * ElementBytes(type);
    }
  }
  const PrefetchTarget prefetch = PrefetchTargetFor(kv_bytes);
  const uint8_t* mask = in.mask.explicit_mask.empty() ? nullptr : in.mask.explicit_mask.data();
  float* w = weights.empty() ? nullptr : weights.data();
  bool gemm_failed = false;

  // One item per (sequence, head). A decode step (T = 1) is AttendRow's GEMV; T > 1 rows (a
  // prefill chunk) are AttendRows' two single-threaded GEMMs, the items spread over the threads.
  const bool reversed = backwards;
  backwards = !backwards;
#pragma omp parallel for schedule(dynamic, 1) if (kOwnParallelRegions)
  for (int64_t i = 0; i < items; ++i) {
    const int64_t item = reversed ? items - 1 - i : i;
    const SequencePlan& p = plans[item / h];
    const int64_t head = item % h;
    const bool enabled = in.head_mask.empty() || in.head_mask[head];
    const int thread = omp_get_thread_num();
    float* prob = probabilities[thread].data();
    float* head_weights = w == nullptr ? nullptr : w + (p.scores * h + head * p.rows * p.keys);
    float* out = ctx + p.q_row * d + head * dk;
    if (!enabled) {
      for (int64_t j = 0; j < p.rows; ++j) std::fill(out + j * d, out + j * d + dk, 0.0f);
      if (head_weights != nullptr) std::fill(head_weights, head_weights + p.rows * p.keys, 0.0f);
      continue;
    }
    KvSegment* head_segments = segments.data() + p.segment + head * p.segments;
    FillSegments(pool, p, head, q, head_segments);
    RowAttention a{.segments = std::span<const KvSegment>(head_segments, p.segments),
                   .keys = p.keys,
                   .head_dim = dk};
    a.scale = scale;
    a.visible_limit = p.causal ? p.past + 1 : p.keys;
    a.explicit_row = mask == nullptr ? nullptr : mask + p.scores;
    a.prefetch = prefetch;
    const float* q_head = q + p.q_row * q_ld + head * dk;
    if (p.rows == 1) {
      AttendRow(a, q_head, head_weights == nullptr ? prob : head_weights, out);
      continue;
    }
    // Tiles of ≤ kRowTile rows bound the probabilities' scratch (a long uncached sequence).
    for (int64_t j = 0; j < p.rows; j += kRowTile) {
      RowAttention tile = a;
      tile.visible_limit = p.causal ? p.past + j + 1 : p.keys;
      if (a.explicit_row != nullptr) tile.explicit_row = a.explicit_row + j * p.keys;
      float* tile_prob = head_weights == nullptr ? prob : head_weights + j * p.keys;
      if (!AttendRows(tile, std::min(kRowTile, p.rows - j), p.causal ? 1 : 0, q_head + j * q_ld,
                      q_ld, tile_prob, out + j * d, d,
                      {.k = keys[thread].data(), .v = values[thread].data()})) {
#pragma omp atomic write
        gemm_failed = true;
      }
    }
  }
  if (gemm_failed) return absl::InternalError("cached attention forward: dnnl_sgemm failed");
  return absl::OkStatus();
}

absl::Status CachedAttentionExecutor::LoadMemory(const AttentionLayer& layer, KvBlockPool& pool,
                                                 const RaggedBatch& memory,
                                                 std::span<KvSequence* const> caches) {
  if (auto s = pool.CheckIdentity(layer.config()); !s.ok()) return s;
  if (auto s = ValidateMemory(memory, layer.config().d_model); !s.ok()) return s;
  if (static_cast<int64_t>(caches.size()) != memory.num_sequences()) {
    return absl::InvalidArgumentError(absl::StrCat("caches: expected one entry per sequence (",
                                                   memory.num_sequences(), "), got ",
                                                   caches.size()));
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] == nullptr || caches[i]->length != 0 || !caches[i]->blocks.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("caches[", i, "]: expected an empty, non-null sequence cache"));
    }
  }
  if (auto s = CheckDistinct(caches); !s.ok()) return s;
  if (auto s = impl_->ReserveAll(pool, caches, memory); !s.ok()) return s;
  absl::Status status;
  try {
    const OpenMpThreadsScope threads(impl_->options.compute_threads);
    status = impl_->Load(layer, pool, memory, caches);
  } catch (const dnnl::error& e) {
    status = OneDnnError(e, "cached attention memory projection");
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("cached attention memory: out of memory for scratch");
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    if (status.ok()) {
      pool.Commit(*caches[i], memory.length(static_cast<int64_t>(i)));
    } else {
      pool.Trim(*caches[i]);
    }
  }
  return status;
}

absl::Status CachedAttentionExecutor::Impl::Load(const AttentionLayer& layer, KvBlockPool& pool,
                                                 const RaggedBatch& memory,
                                                 std::span<KvSequence* const> caches) {
  const int64_t d = layer.config().d_model, m = memory.rows();
  const void* x = memory.data.data();
  if (layer.config().compute_type == ComputeType::kBFloat16) {
    x = Rounded(memory.data.data(), m, d, rounded);  // The bf16 pool's Write rounds K and V.
  }
  float* kv = projected.Reserve(m * 2 * d);
  if (auto s = projections.Run(x, m, layer.kv(), layer.kv_bias(), kv, stream, scratchpad);
      !s.ok()) {
    return s;
  }
  stream.wait();
  for (int64_t i = 0; i < memory.num_sequences(); ++i) {
    const float* rows = kv + memory.offsets[i] * 2 * d;
    pool.Write(*caches[i], memory.length(i), rows, 2 * d, rows + d, 2 * d);
  }
  return absl::OkStatus();
}

}  // namespace attnserve::core
