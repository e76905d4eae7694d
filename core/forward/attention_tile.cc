#include "core/forward/attention_tile.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/forward/onednn_support.h"
#include "core/util/openmp_regions.h"

namespace attnserve::core {
namespace {

using dt = dnnl::memory::data_type;
// Elements from which a head-major copy is shared out over the OpenMP team (~64 KiB: below it the
// team's wake-up costs more than the copy).
constexpr int64_t kParallelCopy = int64_t{32} << 10;

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

constexpr int64_t kRuntime = DNNL_RUNTIME_DIM_VAL;

// The descriptors of one tile's operands, as the C API's plain structs: describing a call's
// operands this way allocates nothing (the C++ wrappers allocate their dims vectors). Every size
// and stride but heads and d_k may be kRuntime (an f32 tile built for any shape); the strided
// views read the heads of the [rows, d_model] buffers as [b, h, rows, d_k] in place.
struct TileDescs {
  dnnl_memory_desc_t q, k_t, v, out, scores, probabilities;
};

int64_t Product(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    if (f == kRuntime) return kRuntime;
    product *= f;
  }
  return product;
}

dnnl_memory_desc_t Strided(std::array<int64_t, 4> sizes, dt type, std::array<int64_t, 4> strides) {
  dnnl_dims_t d{}, st{};
  std::copy(sizes.begin(), sizes.end(), d);
  std::copy(strides.begin(), strides.end(), st);
  dnnl_memory_desc_t desc;
  dnnl::error::wrap_c_api(
      dnnl_memory_desc_init_by_strides(&desc, 4, d, static_cast<dnnl_data_type_t>(type), st),
      "could not describe an attention operand");
  return desc;
}

TileDescs Describe(const TileGeometry& g) {
  const int64_t b = g.batch, h = g.heads, t = g.rows, s = g.keys, dk = g.head_dim;
  const dt operand = g.bf16 ? dt::bf16 : dt::f32;
  const dt result = g.out_bf16 ? dt::bf16 : dt::f32;
  TileDescs d;
  if (g.bf16) {
    // bf16: the matmuls read dense head-major copies (K stored [b, h, s, d_k], read transposed).
    d.q = Strided({b, h, t, dk}, operand, {h * t * dk, t * dk, dk, 1});
    d.k_t = Strided({b, h, dk, s}, operand, {h * s * dk, s * dk, 1, dk});
    d.v = Strided({b, h, s, dk}, operand, {h * s * dk, s * dk, dk, 1});
  } else {
    d.q = Strided({b, h, t, dk}, operand, {g.q_batch_stride, dk, g.q_ld, 1});
    d.k_t = Strided({b, h, dk, s}, operand, {g.kv_batch_stride, dk, 1, g.kv_ld});
    d.v = Strided({b, h, s, dk}, operand, {g.kv_batch_stride, dk, g.kv_ld, 1});
  }
  d.out = Strided({b, h, t, dk}, result, {g.out_batch_stride, dk, g.out_ld, 1});
  // Scores are f32 whatever the operands: scale, mask and softmax stay in f32 (MaskedSoftmaxRow).
  const std::array<int64_t, 4> dense{Product({h, t, s}), Product({t, s}), s, 1};
  d.scores = Strided({b, h, t, s}, dt::f32, dense);
  d.probabilities = Strided({b, h, t, s}, operand, dense);
  return d;
}

// A memory object for one call's operand, created and destroyed through the C API (its
// allocations are oneDNN's own).
class CallMemory {
 public:
  CallMemory(const dnnl_memory_desc_t& desc, const void* data) {
    // oneDNN takes non-const handles but never writes through a source.
    dnnl::error::wrap_c_api(
        dnnl_memory_create(&memory_, &desc, CpuEngine().get(), const_cast<void*>(data)),
        "could not create an attention operand");
  }
  ~CallMemory() { dnnl_memory_destroy(memory_); }
  CallMemory(const CallMemory&) = delete;
  CallMemory& operator=(const CallMemory&) = delete;
  dnnl_memory_t get() const { return memory_; }

 private:
  dnnl_memory_t memory_ = nullptr;
};

// `g` with every size and stride but heads and d_k left to run time.
TileGeometry RuntimeShape(const TileGeometry& g) {
  TileGeometry r = g;
  r.batch = r.rows = r.keys = kRuntime;
  r.q_ld = r.kv_ld = r.out_ld = kRuntime;
  r.q_batch_stride = r.kv_batch_stride = r.out_batch_stride = kRuntime;
  return r;
}

}  // namespace

AttentionTile::AttentionTile(const TileGeometry& g) : geometry_(g), runtime_shape_(!g.bf16) {
  const dnnl::engine& engine = CpuEngine();
  const TileDescs d = Describe(runtime_shape_ ? RuntimeShape(g) : g);
  auto make_scratchpad = [&](const dnnl::primitive_desc_base& pd) {
    scratchpad_bytes_ = std::max(scratchpad_bytes_, pd.scratchpad_desc().get_size());
    return dnnl::memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
  };

  dnnl::primitive_attr scaled = UserScratchpad();
  scaled.set_output_scales(0, {1.0f / std::sqrt(static_cast<float>(g.head_dim))});
  using desc = dnnl::memory::desc;
  const dnnl::matmul::primitive_desc qk_pd(
      dnnl::matmul::desc(desc(d.q), desc(d.k_t), desc(d.scores)), scaled, engine);
  scores_step_.primitive = dnnl::matmul(qk_pd);
  scores_step_.scratchpad = make_scratchpad(qk_pd);
  const dnnl::matmul::primitive_desc pv_pd(
      dnnl::matmul::desc(desc(d.probabilities), desc(d.v), desc(d.out)), UserScratchpad(), engine);
  values_step_.primitive = dnnl::matmul(pv_pd);
  values_step_.scratchpad = make_scratchpad(pv_pd);
  // A runtime-shaped tile describes its operands per call (RunRuntimeStep).
  if (runtime_shape_) return;

  q_ = dnnl::memory(desc(d.q), engine, DNNL_MEMORY_NONE);
  k_ = dnnl::memory(desc(d.k_t), engine, DNNL_MEMORY_NONE);
  v_ = dnnl::memory(desc(d.v), engine, DNNL_MEMORY_NONE);
  out_ = dnnl::memory(desc(d.out), engine, DNNL_MEMORY_NONE);
  scores_ = dnnl::memory(desc(d.scores), engine, DNNL_MEMORY_NONE);
  probabilities_ = dnnl::memory(desc(d.probabilities), engine, DNNL_MEMORY_NONE);
  scores_step_.args = MakeExecArgs({{DNNL_ARG_SRC, &q_},
                                    {DNNL_ARG_WEIGHTS, &k_},
                                    {DNNL_ARG_DST, &scores_},
                                    {DNNL_ARG_SCRATCHPAD, &scores_step_.scratchpad}});
  values_step_.args = MakeExecArgs({{DNNL_ARG_SRC, &probabilities_},
                                    {DNNL_ARG_WEIGHTS, &v_},
                                    {DNNL_ARG_DST, &out_},
                                    {DNNL_ARG_SCRATCHPAD, &values_step_.scratchpad}});

  if (g.bf16) {
    // Q [b, h, t, d_k], then K and V [b, h, s, d_k], each start 64-byte aligned.
    const int64_t b = g.batch, h = g.heads, t = g.rows, s = g.keys, dk = g.head_dim;
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
}

bool AttentionTile::Serves(const TileGeometry& g) const {
  if (!runtime_shape_) return g == geometry_;
  return !g.bf16 && g.heads == geometry_.heads && g.head_dim == geometry_.head_dim &&
         g.out_bf16 == geometry_.out_bf16;
}

void AttentionTile::RunStep(dnnl::stream& stream, Step& step, void* scratch) {
  step.scratchpad.set_data_handle(scratch);
  Execute(step.primitive, stream, step.args);
}

void AttentionTile::RunRuntimeStep(dnnl::stream& stream, Step& step, const dnnl_memory_desc_t& src,
                                   const void* src_data, const dnnl_memory_desc_t& weights,
                                   const void* weights_data, const dnnl_memory_desc_t& dst,
                                   void* dst_data, void* scratch) {
  const CallMemory src_memory(src, src_data);
  const CallMemory weights_memory(weights, weights_data);
  const CallMemory dst_memory(dst, dst_data);
  step.scratchpad.set_data_handle(scratch);
  const std::array<dnnl_exec_arg_t, 4> args{{{DNNL_ARG_SRC, src_memory.get()},
                                             {DNNL_ARG_WEIGHTS, weights_memory.get()},
                                             {DNNL_ARG_DST, dst_memory.get()},
                                             {DNNL_ARG_SCRATCHPAD, step.scratchpad.get()}}};
  dnnl::error::wrap_c_api(dnnl_primitive_execute(step.primitive.get(), stream.get(),
                                                 static_cast<int>(args.size()), args.data()),
                          "could not execute a primitive");
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

void AttentionTile::Scores(dnnl::stream& stream, const TileGeometry& g, const void* q,
                           const void* k, float* scores, void* scratch, void* head_major) {
  if (runtime_shape_) {
    const TileDescs d = Describe(g);
    RunRuntimeStep(stream, scores_step_, d.q, q, d.k_t, k, d.scores, scores, scratch);
    return;
  }
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

void AttentionTile::Values(dnnl::stream& stream, const TileGeometry& g, const void* probabilities,
                           const void* v, void* out, void* scratch, void* head_major) {
  if (runtime_shape_) {
    const TileDescs d = Describe(g);
    RunRuntimeStep(stream, values_step_, d.probabilities, probabilities, d.v, v, d.out, out,
                   scratch);
    return;
  }
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
    // f32 tiles take any size and stride at run time: one per heads and d_k.
    Key key{
        .shape =
            g.bf16 ? g
                   : TileGeometry{.heads = g.heads, .head_dim = g.head_dim, .out_bf16 = g.out_bf16},
        .team_threads = omp_get_max_threads()};
    AttentionTile* tile = cache_.Find(key);
    if (tile == nullptr) tile = cache_.Insert(key, AttentionTile(g));
    scratchpad.Reserve(tile->scratchpad_bytes() / sizeof(float) + 1);
    head_major.Reserve(tile->head_major_bytes() / sizeof(float) + 1);
    return tile;
  } catch (const dnnl::error& e) {
    return OneDnnError(e, "building attention primitives");
  }
}

}  // namespace attnserve::core
