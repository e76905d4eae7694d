// attnserve_model_bench: how long loading a model folder takes (map + validate the safetensors
// file, convert to fp32, transpose to the internal layout, pack for oneDNN), per file dtype and
// model width. This is the cost of a start-up load and of every reload.
//
// Each benchmark writes its folder once into a temporary directory (with bias; seed naming, stored
// as used, or torch naming, stored transposed) and then times LoadModelFolder. Reported counters:
// file_MB (size on disk) and file_MBps (file bytes per second of load time).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/forward/attention_weights.h"
#include "core/model/model.h"
#include "core/model/model_writer.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;

fs::path TempFolder() {
  std::string pattern = (fs::temp_directory_path() / "attnserve_model_bench_XXXXXX").string();
  return mkdtemp(pattern.data());
}

void BM_LoadModelFolder(benchmark::State& state) {
  const int64_t d = state.range(0);
  const auto dtype = static_cast<model::TensorDtype>(state.range(1));
  const auto naming = static_cast<model::WeightNaming>(state.range(2));
  model::ModelConfig config;
  config.attention = {.d_model = d, .num_heads = d / 64, .bias = true};
  const fs::path root = TempFolder();
  const fs::path folder = root / "m";
  if (absl::Status s = model::WriteModelFolder(
          folder, config, core::MakeRandomWeights(config.attention, 1), naming, dtype);
      !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  const double file_bytes = static_cast<double>(fs::file_size(folder / model::kWeightsFileName));
  for (auto _ : state) {
    absl::StatusOr<std::shared_ptr<const model::Model>> m = model::LoadModelFolder(folder);
    if (!m.ok()) {
      state.SkipWithError(std::string(m.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(m->get());
  }
  state.SetLabel(std::string(model::DtypeName(dtype)) + " " +
                 std::string(model::NamingName(naming)));
  state.counters["file_MB"] = file_bytes / 1e6;
  state.counters["file_MBps"] = benchmark::Counter(
      file_bytes / 1e6 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  fs::remove_all(root);
}

BENCHMARK(BM_LoadModelFolder)
    ->ArgNames({"d", "dtype", "naming"})
    ->ArgsProduct({{512, 1024, 2048},
                   {static_cast<int64_t>(model::TensorDtype::kF32),
                    static_cast<int64_t>(model::TensorDtype::kF16),
                    static_cast<int64_t>(model::TensorDtype::kBF16)},
                   {static_cast<int64_t>(model::WeightNaming::kSeed),
                    static_cast<int64_t>(model::WeightNaming::kTorch)}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace attnserve

BENCHMARK_MAIN();
