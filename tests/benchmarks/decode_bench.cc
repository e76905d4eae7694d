// Incremental-decoding benchmarks of attnserve_core_bench, d_model 512, 8 heads, 2
// compute threads; argument bf16:0 is an fp32 model (fp32 KV cache), bf16:1 a bf16-compute model
// whose cache stores K/V in bf16 (half the bytes per cached token); int8:1 stores either model's
// K/V as int8 with a bf16 scale per token and head (66 bytes per 64-wide row, bf16's 128):
//   BM_DecodeBatched      64 sequences with 128 cached tokens each: one decode step of all 64 in
//                         one CachedAttentionExecutor::Forward (M = 64 for the projections);
//                         P:2048, the same with 2048 each (268 MB of bf16 K/V, 139 MB int8).
//   BM_DecodePaused       BM_DecodeBatched's B:64/P:128 step with the cores left idle for pause_us
//                         after each (untimed): 1300 is a one-client service round's time outside
//                         the forward (reading the steps, answering, loopback, the client), so
//                         that pause:1300 is the step the service can expect, pause:0 the ceiling.
//                         Run with --benchmark_enable_random_interleaving: the two differ by less
//                         than this host drifts from minute to minute.
//   BM_DecodeOneAtATime   the same 64 steps as 64 forwards of one sequence each.
//   BM_DecodeGrowing      run_decode_service_bench.sh's session mix, offline: 64 sequences
//                         prefilled with 64 tokens, then 128 decode steps of all 64 (each grows
//                         every cache by one token, 64 -> 192, mean 128; a new block per
//                         sequence every 16 steps), on a fresh pool each time; prefault:1 maps
//                         the pool's pages first, as the server's idle loop does
//                         (--kv-cache-prefault-mb). Only the steps are timed. Against
//                         BM_DecodeBatched/B:64/P:128 it shows what growth costs.
//   BM_DecodeLong         one sequence at 2048 cached tokens, one full decode step (projections
//                         included: their 4 MiB of weights are read too).
//   BM_PagedDecodeKernel  the attention kernel alone: B:1/P:2048 for that step (8 heads × 2048
//                         keys), bytes = the K and V read (2 × 2048 × 512 × 4 = 8.4 MB fp32, × 2 =
//                         4.2 MB bf16); B:64/P:128 for BM_DecodeBatched's (33.6 MB fp32);
//                         int8:2 reads an int8 cache with the fp32 kernel (CPUs without VNNI).
// The machine's read bandwidth they compare with is BM_MemoryRead (ceiling_bench.cc).
// Counters: tokens/s (items) and bytes/s (K/V bytes read: 4, 2 or 1 per element, and int8's
// scales). After each step the
// sequences are cut back to their cached length (Commit + Trim, O(1)), so every iteration does the
// same work (except in BM_DecodeGrowing, whose caches grow as a decoding client's would).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
#include "core/forward/onednn_support.h"
#include "core/kv_cache/cached_attention.h"
#include "core/kv_cache/paged_attention.h"

namespace attnserve {
namespace {

constexpr int kThreads = 2;
constexpr int64_t kD = 512, kHeads = 8;

core::AttentionConfig Config(bool bf16) {
  return {.d_model = kD,
          .num_heads = kHeads,
          .compute_type = bf16 ? core::ComputeType::kBFloat16 : core::ComputeType::kFloat32};
}

// Bytes of K and V one cached token holds: its rows, and an int8 cache's scales.
int64_t TokenBytes(bool bf16, bool int8) {
  if (int8) return 2 * (kD + kHeads * 2);
  return 2 * kD * (bf16 ? 2 : 4);
}

// False (and the benchmark skipped) when a bf16 variant cannot run here.
bool CanRun(benchmark::State& state, bool bf16) {
  if (bf16 && !core::HasBf16Kernels()) {
    state.SkipWithError("no bf16 kernels on this CPU");
    return false;
  }
  return true;
}

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::shared_ptr<const core::AttentionLayer> Layer(bool bf16) {
  core::AttentionWeights w;
  w.w_qkv = Random(kD * 3 * kD, 1);
  w.w_o = Random(kD * kD, 2);
  for (float& x : w.w_qkv) x *= 0.05f;
  for (float& x : w.w_o) x *= 0.05f;
  auto layer = core::AttentionLayer::Create(Config(bf16), w);
  return layer.ok() ? *layer : nullptr;
}

// `sequences` caches prefilled with `past` tokens each, and the executor that filled them.
struct DecodeSetup {
  std::shared_ptr<const core::AttentionLayer> layer;
  std::unique_ptr<core::KvBlockPool> pool;
  core::CachedAttentionExecutor executor{{.compute_threads = kThreads}};
  std::vector<core::KvSequence> seqs;
  int64_t past;

  DecodeSetup(int64_t sequences, int64_t past_tokens, bool bf16, bool int8 = false)
      : layer(Layer(bf16)), seqs(sequences), past(past_tokens) {
    pool = std::move(*core::KvBlockPool::Create(
        Config(bf16), {.block_tokens = 16, .budget_bytes = int64_t{1} << 30, .int8 = int8}));
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
  const bool bf16 = state.range(2) != 0, int8 = state.range(3) != 0;
  if (!CanRun(state, bf16)) return;
  DecodeSetup s(b, past, bf16, int8);
  const std::vector<float> x = Random(b * kD, 4);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    if (!Step(s, 0, b, x, out).ok()) state.SkipWithError("forward failed");
    s.Rewind();
  }
  state.SetItemsProcessed(state.iterations() * b);
  state.SetBytesProcessed(state.iterations() * b * (past + 1) * TokenBytes(bf16, int8));
}
BENCHMARK(BM_DecodeBatched)
    ->ArgNames({"B", "P", "bf16", "int8"})
    ->Args({64, 128, 0, 0})
    ->Args({64, 128, 1, 0})
    ->Args({64, 128, 0, 1})
    ->Args({64, 128, 1, 1})
    ->Args({64, 1, 0, 0})
    ->Args({64, 2048, 1, 0})
    ->Args({64, 2048, 1, 1})
    ->Args({64, 2048, 0, 1})
    ->UseRealTime();

void BM_DecodePaused(benchmark::State& state) {
  const int64_t b = state.range(0), past = state.range(1), pause_us = state.range(3);
  const bool bf16 = state.range(2) != 0;
  if (!CanRun(state, bf16)) return;
  DecodeSetup s(b, past, bf16);
  const std::vector<float> x = Random(b * kD, 4);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    if (!Step(s, 0, b, x, out).ok()) state.SkipWithError("forward failed");
    state.PauseTiming();
    s.Rewind();
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * b);
}
BENCHMARK(BM_DecodePaused)
    ->ArgNames({"B", "P", "bf16", "pause_us"})
    ->Args({64, 128, 0, 0})
    ->Args({64, 128, 0, 1300})
    ->Args({64, 128, 1, 0})
    ->Args({64, 128, 1, 1300})
    ->UseRealTime();

void BM_DecodeOneAtATime(benchmark::State& state) {
  const int64_t b = state.range(0), past = state.range(1);
  const bool bf16 = state.range(2) != 0;
  if (!CanRun(state, bf16)) return;
  DecodeSetup s(b, past, bf16);
  const std::vector<float> x = Random(b * kD, 4);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    for (int64_t i = 0; i < b; ++i) {
      if (!Step(s, i, 1, x, out).ok()) state.SkipWithError("forward failed");
    }
    s.Rewind();
  }
  state.SetItemsProcessed(state.iterations() * b);
  state.SetBytesProcessed(state.iterations() * b * (past + 1) * TokenBytes(bf16, false));
}
BENCHMARK(BM_DecodeOneAtATime)
    ->ArgNames({"B", "P", "bf16"})
    ->Args({64, 128, 0})
    ->Args({64, 128, 1})
    ->Args({64, 1, 0})
    ->UseRealTime();

void BM_DecodeLong(benchmark::State& state) {
  const int64_t past = state.range(0);
  const bool bf16 = state.range(1) != 0, int8 = state.range(2) != 0;
  if (!CanRun(state, bf16)) return;
  DecodeSetup s(1, past, bf16, int8);
  const std::vector<float> x = Random(kD, 4);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    if (!Step(s, 0, 1, x, out).ok()) state.SkipWithError("forward failed");
    s.Rewind();
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * (past + 1) * TokenBytes(bf16, int8));
}
BENCHMARK(BM_DecodeLong)
    ->ArgNames({"P", "bf16", "int8"})
    ->Args({2048, 0, 0})
    ->Args({2048, 1, 0})
    ->Args({2048, 0, 1})
    ->Args({2048, 1, 1})
    ->UseRealTime();

void BM_DecodeGrowing(benchmark::State& state) {
  const int64_t b = state.range(0), prompt = state.range(1), steps = state.range(2);
  const bool bf16 = state.range(3) != 0, prefault = state.range(4) != 0;
  if (!CanRun(state, bf16)) return;
  const std::vector<float> x = Random(b * kD, 4);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    state.PauseTiming();
    auto s = std::make_unique<DecodeSetup>(b, prompt, bf16);
    if (prefault) {
      const int64_t bt = s->pool->options().block_tokens;
      const int64_t blocks = b * ((prompt + steps + bt - 1) / bt);
      s->pool->Prefault(blocks, blocks);
    }
    state.ResumeTiming();
    for (int64_t step = 0; step < steps; ++step) {
      if (!Step(*s, 0, b, x, out).ok()) state.SkipWithError("forward failed");
    }
    state.PauseTiming();
    s.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * b * steps);
}
BENCHMARK(BM_DecodeGrowing)
    ->ArgNames({"B", "P", "S", "bf16", "prefault"})
    ->Args({64, 64, 128, 0, 0})
    ->Args({64, 64, 128, 1, 0})
    ->Args({64, 64, 128, 0, 1})
    ->Args({64, 64, 128, 1, 1})
    ->UseRealTime();

void BM_PagedDecodeKernel(benchmark::State& state) {
  const int64_t b = state.range(0), past = state.range(1), dk = kD / kHeads;
  // int8:2 is the int8 cache read by the fp32 kernel, as on CPUs without AVX-512 VNNI.
  const bool bf16 = state.range(2) != 0, int8 = state.range(3) != 0, int8_dot = state.range(3) != 2;
  if (!CanRun(state, bf16)) return;
  DecodeSetup s(b, past, bf16, int8);
  const int64_t bt = s.pool->options().block_tokens;
  const int64_t blocks = (past + bt - 1) / bt;
  // Per (sequence, head): its blocks' segments, as CachedAttentionExecutor plans them.
  std::vector<core::KvSegment> segments;
  for (const core::KvSequence& seq : s.seqs) {
    for (int64_t head = 0; head < kHeads; ++head) {
      for (int64_t blk = 0; blk < blocks; ++blk) {
        segments.push_back({.k = s.pool->key_data(seq.blocks[blk], head),
                            .v = s.pool->value_data(seq.blocks[blk], head),
                            .count = std::min(bt, past - blk * bt),
                            .ld = dk,
                            .type = s.pool->element_type(),
                            .k_scale = s.pool->key_scales(seq.blocks[blk], head),
                            .v_scale = s.pool->value_scales(seq.blocks[blk], head),
                            .int8_block_rows = int8 ? bt : 0});
      }
    }
  }
  const std::vector<float> q = Random(b * kD, 5);
  std::vector<float> out(b * kD), probabilities(kThreads * past);
  const int64_t items = b * kHeads;
  const core::PrefetchTarget prefetch =
      core::PrefetchTargetFor(b * past * TokenBytes(bf16, int8));  // As the executor picks.
  omp_set_num_threads(kThreads);
  for (auto _ : state) {
    // One item per (sequence, head), handed out as the executor does.
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const core::RowAttention a{.segments = std::span(segments).subspan(item * blocks, blocks),
                                 .keys = past,
                                 .head_dim = dk,
                                 .scale = 0.125f,
                                 .visible_limit = past,
                                 .prefetch = prefetch,
                                 .int8_dot = int8_dot};
      core::AttendRow(a, q.data() + item * dk, probabilities.data() + omp_get_thread_num() * past,
                      out.data() + item * dk);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * b * past * TokenBytes(bf16, int8));
}
BENCHMARK(BM_PagedDecodeKernel)
    ->ArgNames({"B", "P", "bf16", "int8"})
    ->Args({1, 2048, 0, 0})
    ->Args({1, 2048, 1, 0})
    ->Args({1, 2048, 0, 1})
    ->Args({1, 2048, 0, 2})
    ->Args({64, 128, 0, 0})
    ->Args({64, 128, 1, 0})
    ->Args({64, 128, 0, 1})
    ->UseRealTime();

}  // namespace
}  // namespace attnserve
