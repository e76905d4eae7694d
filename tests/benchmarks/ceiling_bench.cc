// The machine's ceilings, for comparison with the layer's benchmarks (part of
// attnserve_core_bench):
//   BM_Matmul  one oneDNN matmul, weights pre-packed once in the layout oneDNN picks (as the layer
//              packs its own), f32 output, 2 OpenMP threads; fp32 or bf16 operands (bf16:1). The
//              shapes are the layer's projections for B·T = 4096 rows at d_model 512: the fused
//              QKV (N = 1536) and W_O (N = 512).
// A forward pass's GFLOP/s divided by BM_Matmul's in the same run is the share of the machine's
// GEMM speed the layer reaches. That share, unlike the absolute figure, can be compared across
// hosts running at different speeds; and bf16 / fp32 of BM_Matmul is the most a bf16 layer can
// gain over fp32 on this host.
//   BM_MemoryRead  read bandwidth, to compare the decode kernel's K/V read rate with: a sum over a
//              buffer on 2 OpenMP threads, each reading its half. 8 MiB stays in the 32 MiB L3
//              (like one sequence's K/V at 2048 cached tokens); 34 MiB is the K/V of 64 sequences
//              at 129 tokens (BM_DecodeBatched, fp32: 33.8 MB, just over the L3); 512 MiB comes
//              from DRAM.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>

#include "core/forward/onednn_support.h"
#include "core/util/aligned_buffer.h"
#include "core/util/per_isa_clones.h"
#include "tests/benchmarks/flop_counters.h"

namespace attnserve {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

constexpr int kThreads = 2;  // As the forward and decode rows.

void BM_Matmul(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const bool bf16 = state.range(3) != 0;
  if (bf16 && !core::HasBf16Kernels()) {
    state.SkipWithError("no bf16 kernels on this CPU");
    return;
  }
  omp_set_num_threads(kThreads);
  const dnnl::engine& engine = core::CpuEngine();
  dnnl::stream stream(engine);
  const dt operand = bf16 ? dt::bf16 : dt::f32;
  const dnnl::memory::desc src_md({m, k}, operand, tag::ab);
  const dnnl::memory::desc plain_weights_md({k, n}, operand, tag::ab);
  const dnnl::memory::desc any_weights_md({k, n}, operand, tag::any);
  const dnnl::memory::desc dst_md({m, n}, dt::f32, tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, any_weights_md, dst_md), engine);
  const dnnl::matmul matmul(pd);

  // Zero-filled operands: the kernels' speed does not depend on the values.
  dnnl::memory src(src_md, engine), plain_weights(plain_weights_md, engine);
  dnnl::memory weights(pd.weights_desc(), engine), dst(dst_md, engine);
  for (dnnl::memory* mem : {&src, &plain_weights, &weights, &dst}) {
    std::fill_n(static_cast<char*>(mem->get_data_handle()), mem->get_desc().get_size(), 0);
  }
  dnnl::reorder(plain_weights, weights).execute(stream, plain_weights, weights);
  const core::ExecArgs args = core::MakeExecArgs(
      {{DNNL_ARG_SRC, &src}, {DNNL_ARG_WEIGHTS, &weights}, {DNNL_ARG_DST, &dst}});
  core::Execute(matmul, stream, args);  // Warm-up: JIT and first touch.
  stream.wait();
  for (auto _ : state) {
    core::Execute(matmul, stream, args);
    stream.wait();
  }
  SetFlopCounters(state,
                  2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n));
}
BENCHMARK(BM_Matmul)
    ->ArgNames({"M", "K", "N", "bf16"})
    ->Args({4096, 512, 1536, 0})
    ->Args({4096, 512, 1536, 1})
    ->Args({4096, 512, 512, 0})
    ->Args({4096, 512, 512, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

using Vec16 = float __attribute__((vector_size(64)));
constexpr int64_t kVecFloats = 16, kChains = 8;

// Σ data[0, n), n a multiple of kChains · 16. Eight independent vector sums: with one, each add
// waits for the previous one (4 cycles), which caps a core at 16 floats per add latency (~40 GB/s
// here), below what its caches deliver; a bandwidth figure must not measure that instead.
ATTNSERVE_PER_ISA_CLONES float SumFloats(const float* data, int64_t n) {
  Vec16 chains[kChains] = {};
  for (int64_t i = 0; i < n; i += kChains * kVecFloats) {
    for (int64_t c = 0; c < kChains; ++c) {
      Vec16 v;
      std::memcpy(&v, data + i + c * kVecFloats, sizeof v);
      chains[c] += v;
    }
  }
  Vec16 total = {};
  for (const Vec16& c : chains) total += c;
  float sum = 0.0f;
  for (int64_t l = 0; l < kVecFloats; ++l) sum += total[l];
  return sum;
}

void BM_MemoryRead(benchmark::State& state) {
  const int64_t n = state.range(0) / 4;
  const int64_t per_thread = n / kThreads;
  core::AlignedBuffer buffer(n);
  float* data = buffer.data();
  omp_set_num_threads(kThreads);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < kThreads; ++t) {  // Each thread's half first touched by it.
    std::fill_n(data + t * per_thread, per_thread, 1.0f);
  }
  for (auto _ : state) {
    float sum = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int t = 0; t < kThreads; ++t) sum += SumFloats(data + t * per_thread, per_thread);
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
}
BENCHMARK(BM_MemoryRead)
    ->ArgNames({"bytes"})
    ->Arg(8 << 20)
    ->Arg(34 << 20)
    ->Arg(512 << 20)
    ->UseRealTime();

}  // namespace
}  // namespace attnserve
