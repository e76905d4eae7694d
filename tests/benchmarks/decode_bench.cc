// Incremental-decoding benchmarks of attnserve_core_bench (issue 18), d_model 512, 8 heads, fp32,
// 2 compute threads:
//   BM_DecodeBatched      64 sequences with 128 cached tokens each: one decode step of all 64 in
//                         one CachedAttentionExecutor::Forward (M = 64 for the projections).
//   BM_DecodeOneAtATime   the same 64 steps as 64 forwards of one sequence each.
//   BM_DecodeLong         one sequence at 2048 cached tokens, one full decode step (projections
//                         included: their 4 MiB of weights are read too).
//   BM_PagedDecodeKernel  the attention kernel alone for that step (8 heads × 2049 keys), bytes =
//                         the K and V read (2 × 2049 × 512 × 4 = 8.4 MB).
//   BM_MemoryRead         the machine's read bandwidth, for comparison: a vectorised sum over a
//                         buffer on 2 OpenMP threads; 8 MiB (like the K/V above, L3-resident on
//                         a 32 MiB L3) and 512 MiB (DRAM).
// Counters: tokens/s (items) and bytes/s. After each step the sequences are cut back to their
// cached length (Commit + Trim, O(1)), so every iteration does the same work.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/attention_layer.h"
#include "core/attention_weights.h"
#include "core/kv_cache/cached_attention.h"
#include "core/kv_cache/paged_attention.h"
#include "core/util/aligned_buffer.h"

namespace attnserve {
namespace {

constexpr int kThreads = 2;
constexpr int64_t kD = 512, kHeads = 8;
const core::AttentionConfig kConfig{.d_model = kD, .num_heads = kHeads};

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::shared_ptr<const core::AttentionLayer> Layer() {
  core::AttentionWeights w;
  w.w_qkv = Random(kD * 3 * kD, 1);
  w.w_o = Random(kD * kD, 2);
  for (float& x : w.w_qkv) x *= 0.05f;
  for (float& x : w.w_o) x *= 0.05f;
  auto layer = core::AttentionLayer::Create(kConfig, w);
  return layer.ok() ? *layer : nullptr;
}

// `sequences` caches prefilled with `past` tokens each, and the executor that filled them.
struct DecodeSetup {
  std::shared_ptr<const core::AttentionLayer> layer = Layer();
  std::unique_ptr<core::KvBlockPool> pool;
  core::CachedAttentionExecutor executor{{.compute_threads = kThreads}};
  std::vector<core::KvSequence> seqs;
  int64_t past;

  DecodeSetup(int64_t sequences, int64_t past_tokens) : seqs(sequences), past(past_tokens) {
    pool = std::move(*core::KvBlockPool::Create(
        kConfig, {.block_tokens = 16, .budget_bytes = int64_t{1} << 30}));
    const std::vector<float> x = Random(past * kD, 3);
    const std::vector<int64_t> offsets{0, past};
    std::vector<float> out(x.size());
    for (core::KvSequence& s : seqs) {
      core::KvSequence* caches[] = {&s};
      (void)executor.Forward(*layer, *pool, {.query = {x, offsets}, .caches = caches},
                             {.output = out});
    }
  }
  void Rewind() {
    for (core::KvSequence& s : seqs) {
      pool->Commit(s, past);
      pool->Trim(s);
    }
  }
};

absl::Status Step(DecodeSetup& s, int64_t first, int64_t count, const std::vector<float>& x,
                  std::vector<float>& out) {
  std::vector<int64_t> offsets(count + 1);
  std::vector<core::KvSequence*> caches(count);
  for (int64_t i = 0; i < count; ++i) {
    offsets[i + 1] = i + 1;
    caches[i] = &s.seqs[first + i];
  }
  const std::span<const float> rows(x.data() + first * kD, count * kD);
  return s.executor.Forward(*s.layer, *s.pool,
                            {.query = {rows, offsets}, .caches = caches, .mask = {.causal = true}},
                            {.output = std::span(out).subspan(first * kD, count * kD)});
}

void BM_DecodeBatched(benchmark::State& state) {
  const int64_t b = state.range(0), past = state.range(1);
  DecodeSetup s(b, past);
  const std::vector<float> x = Random(b * kD, 4);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    if (!Step(s, 0, b, x, out).ok()) state.SkipWithError("forward failed");
    s.Rewind();
  }
  state.SetItemsProcessed(state.iterations() * b);
  state.SetBytesProcessed(state.iterations() * b * 2 * (past + 1) * kD * 4);
}
BENCHMARK(BM_DecodeBatched)->ArgNames({"B", "P"})->Args({64, 128})->Args({64, 1})->UseRealTime();

void BM_DecodeOneAtATime(benchmark::State& state) {
  const int64_t b = state.range(0), past = state.range(1);
  DecodeSetup s(b, past);
  const std::vector<float> x = Random(b * kD, 4);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    for (int64_t i = 0; i < b; ++i) {
      if (!Step(s, i, 1, x, out).ok()) state.SkipWithError("forward failed");
    }
    s.Rewind();
  }
  state.SetItemsProcessed(state.iterations() * b);
}
BENCHMARK(BM_DecodeOneAtATime)->ArgNames({"B", "P"})->Args({64, 128})->Args({64, 1})->UseRealTime();

void BM_DecodeLong(benchmark::State& state) {
  const int64_t past = state.range(0);
  DecodeSetup s(1, past);
  const std::vector<float> x = Random(kD, 4);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    if (!Step(s, 0, 1, x, out).ok()) state.SkipWithError("forward failed");
    s.Rewind();
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * 2 * (past + 1) * kD * 4);
}
BENCHMARK(BM_DecodeLong)->ArgNames({"P"})->Arg(2048)->UseRealTime();

void BM_PagedDecodeKernel(benchmark::State& state) {
  const int64_t past = state.range(0), dk = kD / kHeads;
  DecodeSetup s(1, past);
  const core::KvSequence& seq = s.seqs[0];
  const int64_t bt = s.pool->options().block_tokens;
  const int64_t blocks = static_cast<int64_t>(seq.blocks.size());
  std::vector<core::KvSegment> segments;
  for (int64_t head = 0; head < kHeads; ++head) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      segments.push_back({s.pool->keys(seq.blocks[blk], head),
                          s.pool->values(seq.blocks[blk], head), std::min(bt, past - blk * bt),
                          dk});
    }
  }
  const std::vector<float> q = Random(kD, 5);
  std::vector<float> out(kD), probabilities(kHeads * past);
  omp_set_num_threads(kThreads);
  for (auto _ : state) {
#pragma omp parallel for
    for (int64_t head = 0; head < kHeads; ++head) {
      const core::RowAttention a{.segments = std::span(segments).subspan(head * blocks, blocks),
                                 .keys = past,
                                 .head_dim = dk,
                                 .scale = 0.125f,
                                 .visible_limit = past};
      core::AttendRow(a, q.data() + head * dk, probabilities.data() + head * past,
                      out.data() + head * dk);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * 2 * past * kD * 4);
}
BENCHMARK(BM_PagedDecodeKernel)->ArgNames({"P"})->Arg(2048)->UseRealTime();

void BM_MemoryRead(benchmark::State& state) {
  const int64_t n = state.range(0) / 4;
  core::AlignedBuffer buffer(n);
  float* data = buffer.data();
  for (int64_t i = 0; i < n; ++i) data[i] = 1.0f;
  omp_set_num_threads(kThreads);
  for (auto _ : state) {
    float sum = 0.0f;
#pragma omp parallel for simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += data[i];
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
}
BENCHMARK(BM_MemoryRead)->ArgNames({"bytes"})->Arg(8 << 20)->Arg(512 << 20)->UseRealTime();

}  // namespace
}  // namespace attnserve
