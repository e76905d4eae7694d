// The wire formats' conversions, per tensor: core/util/float_format.h's fp32 <-> bf16 / f16 of a
// T=128, d_model=512 request (what the server spends decoding a 16-bit input and encoding a
// 16-bit answer, and the client the other way round; the same conversions load F16/BF16
// safetensors files), and core/util/json_numbers.h's JSON arrays of the REST binding. Part of
// attnserve_model_bench.
#include <benchmark/benchmark.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/util/float_format.h"
#include "core/util/json_numbers.h"

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

// The REST binding's JSON numbers: a T=16, d_model=512 tensor (8,192 floats) written as a JSON
// array (what the server does with a JSON answer, and a REST client with its input) and read
// back (the other way round).
constexpr int64_t kJsonElements = 16 * 512;

void BM_WriteJsonFloats(benchmark::State& state) {
  const std::vector<float> values = Values();
  const std::span<const float> tensor(values.data(), kJsonElements);
  std::string text;
  for (auto _ : state) {
    text.clear();
    AppendJsonFloats(tensor, &text);
    benchmark::DoNotOptimize(text.data());
  }
  state.counters["bytes_per_number"] = static_cast<double>(text.size()) / kJsonElements;
  state.SetItemsProcessed(state.iterations() * kJsonElements);
}

void BM_ParseJsonFloats(benchmark::State& state) {
  const std::vector<float> values = Values();
  std::string text;
  AppendJsonFloats(std::span<const float>(values.data(), kJsonElements), &text);
  std::vector<double> parsed;
  parsed.reserve(kJsonElements);
  for (auto _ : state) {
    parsed.clear();
    if (ParseJsonNumberArray(text, 1, &parsed) == 0) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(parsed.data());
  }
  state.SetItemsProcessed(state.iterations() * kJsonElements);
}

BENCHMARK(BM_WriteJsonFloats)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ParseJsonFloats)->Unit(benchmark::kMicrosecond);

// 0 = fp32, 1 = bf16, 2 = f16 (FloatFormat's order).
BENCHMARK(BM_EncodeFloats)->ArgName("format")->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeFloats)->ArgName("format")->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnserve
