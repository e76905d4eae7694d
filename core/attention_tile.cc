#include "core/attention_tile.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/onednn_support.h"
#include "core/util/openmp_regions.h"

namespace attnserve::core {
namespace {

using dt = dnnl::memory::data_type;
// Elements from which a head-major copy is shared out over the OpenMP team (~64 KiB: below it the
// team's wake-up costs more than the copy).
constexpr int64_t kParallelCopy = int64_t{32} << 10;
using dims = dnnl::memory::dims;

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

}  // namespace

AttentionTile::AttentionTile(const TileGeometry& g) : geometry_(g) {
  const dnnl::engine& engine = CpuEngine();
  const int64_t b = g.batch, h = g.heads, t = g.rows, s = g.keys, dk = g.head_dim;
  const dt operand = g.bf16 ? dt::bf16 : dt::f32;
  const dt result = g.out_bf16 ? dt::bf16 : dt::f32;
  // Heads are a stride of d_k inside a row: the [rows, d_model] buffers read as [b, h, rows, d_k].
  const dnnl::memory::desc q_view({b, h, t, dk}, operand, dims{g.q_batch_stride, dk, g.q_ld, 1});
  const dnnl::memory::desc k_t_view({b, h, dk, s}, operand,
                                    dims{g.kv_batch_stride, dk, 1, g.kv_ld});
  const dnnl::memory::desc v_view({b, h, s, dk}, operand, dims{g.kv_batch_stride, dk, g.kv_ld, 1});
  // bf16: the matmuls read dense head-major copies (K stored [b, h, s, d_k], read transposed).
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc q =
      g.bf16 ? dnnl::memory::desc({b, h, t, dk}, operand, tag::abcd) : q_view;
  const dnnl::memory::desc k_t =
      g.bf16 ? dnnl::memory::desc({b, h, dk, s}, operand, tag::abdc) : k_t_view;
  const dnnl::memory::desc v =
      g.bf16 ? dnnl::memory::desc({b, h, s, dk}, operand, tag::abcd) : v_view;
  const dnnl::memory::desc out({b, h, t, dk}, result, dims{g.out_batch_stride, dk, g.out_ld, 1});
  // Scores are f32 whatever the operands: scale, mask and softmax stay in f32 (MaskedSoftmaxRow).
  const dnnl::memory::desc scores({b, h, t, s}, dt::f32, dnnl::memory::format_tag::abcd);
  const dnnl::memory::desc probabilities({b, h, t, s}, operand, dnnl::memory::format_tag::abcd);

  q_ = dnnl::memory(q, engine, DNNL_MEMORY_NONE);
  k_ = dnnl::memory(k_t, engine, DNNL_MEMORY_NONE);
  v_ = dnnl::memory(v, engine, DNNL_MEMORY_NONE);
  out_ = dnnl::memory(out, engine, DNNL_MEMORY_NONE);
  scores_ = dnnl::memory(scores, engine, DNNL_MEMORY_NONE);
  probabilities_ = dnnl::memory(probabilities, engine, DNNL_MEMORY_NONE);

  auto make_scratchpad = [&](const dnnl::primitive_desc_base& pd) {
    scratchpad_bytes_ = std::max(scratchpad_bytes_, pd.scratchpad_desc().get_size());
    return dnnl::memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
  };

  if (g.bf16) {
    // Q [b, h, t, d_k], then K and V [b, h, s, d_k], each start 64-byte aligned.
    const auto bytes = [](int64_t elements) { return (elements * 2 + 63) / 64 * 64; };
    q_copy_ = {.batch_stride = g.q_batch_stride, .ld = g.q_ld, .rows = t, .offset = 0};
    k_copy_ = {.batch_stride = g.kv_batch_stride,
               .ld = g.kv_ld,
               .rows = s,
               .offset = static_cast<size_t>(bytes(b * h * t * dk))};
    v_copy_ = k_copy_;
    v_copy_.offset = k_copy_.offset + static_cast<size_t>(bytes(b * h * s * dk));
    head_major_bytes_ = v_copy_.offset + static_cast<size_t>(bytes(b * h * s * dk));
  }

  dnnl::primitive_attr scaled = UserScratchpad();
  scaled.set_output_scales(0, {1.0f / std::sqrt(static_cast<float>(dk))});
  const dnnl::matmul::primitive_desc qk_pd(dnnl::matmul::desc(q, k_t, scores), scaled, engine);
  scores_step_.primitive = dnnl::matmul(qk_pd);
  scores_step_.scratchpad = make_scratchpad(qk_pd);
  scores_step_.args = MakeExecArgs({{DNNL_ARG_SRC, &q_},
                                    {DNNL_ARG_WEIGHTS, &k_},
                                    {DNNL_ARG_DST, &scores_},
                                    {DNNL_ARG_SCRATCHPAD, &scores_step_.scratchpad}});

  const dnnl::matmul::primitive_desc pv_pd(dnnl::matmul::desc(probabilities, v, out),
                                           UserScratchpad(), engine);
  values_step_.primitive = dnnl::matmul(pv_pd);
  values_step_.scratchpad = make_scratchpad(pv_pd);
  values_step_.args = MakeExecArgs({{DNNL_ARG_SRC, &probabilities_},
                                    {DNNL_ARG_WEIGHTS, &v_},
                                    {DNNL_ARG_DST, &out_},
                                    {DNNL_ARG_SCRATCHPAD, &values_step_.scratchpad}});
}

void AttentionTile::RunStep(dnnl::stream& stream, Step& step, void* scratch) {
  step.scratchpad.set_data_handle(scratch);
  Execute(step.primitive, stream, step.args);
}

void* AttentionTile::CopyHeads(const Copy& copy, const void* from, void* head_major) const {
  // Row r of head j of sequence i: d_k elements at from + i·batch_stride + r·ld + j·d_k, written
  // to ((i·heads + j)·rows + r)·d_k.
  const int64_t dk = geometry_.head_dim, heads = geometry_.heads;
  const auto* source = static_cast<const uint16_t*>(from);
  auto* destination = reinterpret_cast<uint16_t*>(static_cast<char*>(head_major) + copy.offset);
  // A whole batch's tile (the executor's batched path) is copied by the team that then runs its
  // matmuls; inside the executor's per-head region this runs on the calling thread alone.
  const int64_t planes = geometry_.batch * heads;
#pragma omp parallel for schedule(static) if (kOwnParallelRegions && planes > 1 && \
                                              planes * copy.rows * dk >= kParallelCopy)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const uint16_t* row = source + (plane / heads) * copy.batch_stride + (plane % heads) * dk;
    uint16_t* to = destination + plane * copy.rows * dk;
    for (int64_t r = 0; r < copy.rows; ++r, to += dk) {
      std::memcpy(to, row + r * copy.ld, static_cast<size_t>(dk) * sizeof(uint16_t));
    }
  }
  return destination;
}

void AttentionTile::Scores(dnnl::stream& stream, const void* q, const void* k, float* scores,
                           void* scratch, void* head_major) {
  if (head_major_bytes_ > 0) {
    q = CopyHeads(q_copy_, q, head_major);
    k = CopyHeads(k_copy_, k, head_major);
  }
  // oneDNN takes non-const handles but never writes through a source.
  q_.set_data_handle(const_cast<void*>(q));
  k_.set_data_handle(const_cast<void*>(k));
  scores_.set_data_handle(scores);
  RunStep(stream, scores_step_, scratch);
}

void AttentionTile::Values(dnnl::stream& stream, const void* probabilities, const void* v,
                           void* out, void* scratch, void* head_major) {
  if (head_major_bytes_ > 0) v = CopyHeads(v_copy_, v, head_major);
  probabilities_.set_data_handle(const_cast<void*>(probabilities));
  v_.set_data_handle(const_cast<void*>(v));
  out_.set_data_handle(out);
  RunStep(stream, values_step_, scratch);
}

absl::StatusOr<AttentionTile*> AttentionTileCache::Get(const TileGeometry& g,
                                                       AlignedBuffer& scratchpad,
                                                       AlignedBuffer& head_major) {
  try {
    AttentionTile* tile = cache_.Find(g);
    if (tile == nullptr) tile = cache_.Insert(g, AttentionTile(g));
    scratchpad.Reserve(tile->scratchpad_bytes() / sizeof(float) + 1);
    head_major.Reserve(tile->head_major_bytes() / sizeof(float) + 1);
    return tile;
  } catch (const dnnl::error& e) {
    return OneDnnError(e, "building attention primitives");
  }
}

}  // namespace attnserve::core
