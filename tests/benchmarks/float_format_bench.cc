// The wire formats' conversions (core/util/float_format.h), per tensor of a T=128, d_model=512
// request: what the server spends decoding a 16-bit input and encoding a 16-bit answer, and the
// client the other way round. Part of attnserve_model_bench (the same conversions load F16/BF16
// safetensors files).
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/util/float_format.h"

namespace attnserve {
namespace {

constexpr int64_t kElements = 128 * 512;

FloatFormat FormatOf(int64_t index) { return static_cast<FloatFormat>(index); }

std::vector<float> Values() {
  std::vector<float> values(kElements);
  for (int64_t i = 0; i < kElements; ++i) values[i] = std::sin(0.01f * static_cast<float>(i));
  return values;
}

void BM_EncodeFloats(benchmark::State& state) {
  const FloatFormat format = FormatOf(state.range(0));
  const std::vector<float> values = Values();
  std::string bytes(kElements * FloatFormatBytes(format), '\0');
  for (auto _ : state) {
    EncodeFloats(values, format, bytes.data());
    benchmark::DoNotOptimize(bytes.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(FloatFormatName(format)));
  state.SetItemsProcessed(state.iterations() * kElements);
}

void BM_DecodeFloats(benchmark::State& state) {
  const FloatFormat format = FormatOf(state.range(0));
  const std::vector<float> values = Values();
  std::string bytes(kElements * FloatFormatBytes(format), '\0');
  EncodeFloats(values, format, bytes.data());
  std::vector<float> decoded(kElements);
  for (auto _ : state) {
    DecodeFloats(bytes.data(), kElements, format, decoded.data());
    benchmark::DoNotOptimize(decoded.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(FloatFormatName(format)));
  state.SetItemsProcessed(state.iterations() * kElements);
}

// 0 = fp32, 1 = bf16, 2 = f16 (FloatFormat's order).
BENCHMARK(BM_EncodeFloats)->ArgName("format")->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeFloats)->ArgName("format")->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnserve
