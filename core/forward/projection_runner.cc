#include "core/forward/projection_runner.h"

#include "core/forward/onednn_support.h"

namespace attnserve::core {
namespace {
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

size_t ElementBytes(dt type) { return type == dt::bf16 ? 2 : 4; }
}  // namespace

int64_t FirstRowPiece(int64_t m) {
  if (m < 64) return m;
  const int64_t granule = m >= 4096 ? 1024 : m >= 1024 ? 256 : 64;
  return m / granule * granule;
}

ProjectionRunner::Entry ProjectionRunner::Build(const Key& key, const PackedMatrix& weights) {
  const dnnl::engine& engine = CpuEngine();
  const dnnl::memory::desc src({key.m, key.k}, key.src_type, tag::ab);
  const dnnl::memory::desc dst({key.m, key.n}, key.dst_type, tag::ab);
  const dnnl::memory::desc bias =
      key.bias ? dnnl::memory::desc({1, key.n}, dt::f32, tag::ab) : dnnl::memory::desc();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, weights.desc, bias, dst), attr,
                                        engine);
  Entry e;
  e.primitive = dnnl::matmul(pd);
  e.src = dnnl::memory(src, engine, DNNL_MEMORY_NONE);
  e.weights = dnnl::memory(weights.desc, engine, DNNL_MEMORY_NONE);
  e.dst = dnnl::memory(dst, engine, DNNL_MEMORY_NONE);
  e.scratchpad = dnnl::memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
  e.scratchpad_bytes = pd.scratchpad_desc().get_size();
  e.bias = dnnl::memory(bias, engine, DNNL_MEMORY_NONE);
  e.args = MakeExecArgs({{DNNL_ARG_SRC, &e.src},
                         {DNNL_ARG_WEIGHTS, &e.weights},
                         {DNNL_ARG_DST, &e.dst},
                         {DNNL_ARG_SCRATCHPAD, &e.scratchpad}});
  if (key.bias) e.args.push_back({DNNL_ARG_BIAS, e.bias.get()});
  return e;
}

absl::Status ProjectionRunner::Run(const void* src, int64_t m, const PackedMatrix& weights,
                                   std::span<const float> bias, void* dst, dnnl::stream& stream,
                                   AlignedBuffer& scratchpad, dnnl::memory::data_type dst_type) {
  const size_t src_row_bytes =
      static_cast<size_t>(weights.rows) * ElementBytes(weights.data_type());
  const size_t dst_row_bytes = static_cast<size_t>(weights.cols) * ElementBytes(dst_type);
  for (int64_t row = 0, piece = 0; row < m; row += piece) {
    piece = FirstRowPiece(m - row);
    const Key key{piece, weights.rows, weights.cols, !bias.empty(), weights.data_type(), dst_type};
    const auto* piece_src =
        static_cast<const char*>(src) + static_cast<size_t>(row) * src_row_bytes;
    auto* piece_dst = static_cast<char*>(dst) + static_cast<size_t>(row) * dst_row_bytes;
    if (auto s = RunPiece(key, piece_src, weights, bias, piece_dst, stream, scratchpad); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ProjectionRunner::RunPiece(const Key& key, const void* src,
                                        const PackedMatrix& weights, std::span<const float> bias,
                                        void* dst, dnnl::stream& stream,
                                        AlignedBuffer& scratchpad) {
  try {
    Entry* e = cache_.Find(key);
    if (e == nullptr) e = cache_.Insert(key, Build(key, weights));
    float* scratch = scratchpad.Reserve(e->scratchpad_bytes / sizeof(float) + 1);
    // oneDNN takes non-const handles but never writes through src, weights or bias.
    e->src.set_data_handle(const_cast<void*>(src));
    e->weights.set_data_handle(const_cast<float*>(weights.data()));
    if (key.bias) e->bias.set_data_handle(const_cast<float*>(bias.data()));
    e->dst.set_data_handle(dst);
    e->scratchpad.set_data_handle(scratch);
    Execute(e->primitive, stream, e->args);
    return absl::OkStatus();
  } catch (const dnnl::error& e) {
    return OneDnnError(e, "projection matmul");
  }
}

}  // namespace attnserve::core
