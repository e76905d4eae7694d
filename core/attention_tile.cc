#include "core/attention_tile.h"

#include <algorithm>
#include <cmath>

#include "core/onednn_support.h"

namespace attnserve::core {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

}  // namespace

AttentionTile::AttentionTile(const TileGeometry& g) {
  const dnnl::engine& engine = CpuEngine();
  const int64_t b = g.batch, h = g.heads, t = g.rows, s = g.keys, dk = g.head_dim;
  const dt operand = g.bf16 ? dt::bf16 : dt::f32;
  const dt result = g.out_bf16 ? dt::bf16 : dt::f32;
  // Heads are a stride of d_k inside a row: the [rows, d_model] buffers read as [b, h, rows, d_k].
  const dnnl::memory::desc q({b, h, t, dk}, operand, dims{g.q_batch_stride, dk, g.q_ld, 1});
  const dnnl::memory::desc k_t({b, h, dk, s}, operand, dims{g.kv_batch_stride, dk, 1, g.kv_ld});
  const dnnl::memory::desc v({b, h, s, dk}, operand, dims{g.kv_batch_stride, dk, g.kv_ld, 1});
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

void AttentionTile::Scores(dnnl::stream& stream, const void* q, const void* k, float* scores,
                           void* scratch) {
  // oneDNN takes non-const handles but never writes through a source.
  q_.set_data_handle(const_cast<void*>(q));
  k_.set_data_handle(const_cast<void*>(k));
  scores_.set_data_handle(scores);
  RunStep(stream, scores_step_, scratch);
}

void AttentionTile::Values(dnnl::stream& stream, const void* probabilities, const void* v,
                           void* out, void* scratch) {
  probabilities_.set_data_handle(const_cast<void*>(probabilities));
  v_.set_data_handle(const_cast<void*>(v));
  out_.set_data_handle(out);
  RunStep(stream, values_step_, scratch);
}

absl::StatusOr<AttentionTile*> AttentionTileCache::Get(const TileGeometry& g,
                                                       AlignedBuffer& scratchpad) {
  try {
    AttentionTile* tile = cache_.Find(g);
    if (tile == nullptr) tile = cache_.Insert(g, AttentionTile(g));
    scratchpad.Reserve(tile->scratchpad_bytes() / sizeof(float) + 1);
    return tile;
  } catch (const dnnl::error& e) {
    return OneDnnError(e, "building attention primitives");
  }
}

}  // namespace attnserve::core
