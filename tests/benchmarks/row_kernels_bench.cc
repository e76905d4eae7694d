// Part of attnserve_core_bench: the per-row loops around the GEMMs, alone on one thread.
//   BM_MaskedSoftmaxRow  the forward's fused softmax (core/forward/masked_softmax.h) over a tile of
//   score
//                        rows (4096 rows of 128 keys, or 256 of 2048), f32 or bf16 output; the
//                        scores are restored from a copy before each pass (not timed).
//   BM_FindNonFinite     the finiteness scan every forward runs on its input and output
//                        (core/forward/finite_values.h), over 256 KiB (L2) and 8 MiB (a B=32,
//                        T=128, d=512 batch) of finite floats.
// Counters: items/s (scores or floats) and bytes/s (floats read).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/forward/finite_values.h"
#include "core/forward/masked_softmax.h"

namespace attnserve {
namespace {

void BM_MaskedSoftmaxRow(benchmark::State& state) {
  const int64_t keys = state.range(0);
  const bool bf16 = state.range(1) != 0;
  const int64_t rows = (int64_t{512} << 10) / keys;  // 512 Ki scores: an L2-sized tile.
  std::mt19937 rng(1);
  std::normal_distribution<float> score(0.0f, 2.0f);
  std::vector<float> source(rows * keys);
  for (float& s : source) s = score(rng);
  std::vector<float> scores(source.size());
  std::vector<uint16_t> out(source.size());
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(source.begin(), source.end(), scores.begin());
    state.ResumeTiming();
    for (int64_t r = 0; r < rows; ++r) {
      core::MaskedSoftmaxRow(scores.data() + r * keys, keys, {.visible_limit = keys},
                             bf16 ? out.data() + r * keys : nullptr);
    }
    benchmark::DoNotOptimize(scores.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * keys);
}
BENCHMARK(BM_MaskedSoftmaxRow)
    ->ArgNames({"keys", "bf16"})
    ->ArgsProduct({{128, 2048}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

void BM_FindNonFinite(benchmark::State& state) {
  const std::vector<float> values(state.range(0) / sizeof(float), 1.0f);
  for (auto _ : state) benchmark::DoNotOptimize(core::FindNonFinite(values));
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(values.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_FindNonFinite)->ArgName("bytes")->Arg(256 << 10)->Arg(8 << 20);

}  // namespace
}  // namespace attnserve
