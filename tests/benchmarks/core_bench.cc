// attnserve_core_bench: Google Benchmark timings of AttentionExecutor::Forward, reported as time
// per forward pass and GFLOP/s.
//
// FLOPs per forward pass (one multiply-add = 2 FLOPs):
//   projections  2·N·d² for Q, 2·M·d² each for K and V, 2·N·d² for W_O (multi-head only), where
//                N = total query rows and M = total key rows (M = N for self-attention). That is
//                8·N·d² for multi-head self-attention (fused QKV 6·N·d² + W_O 2·N·d²) and 6·N·d²
//                for the single-head variant.
//   attention    4·Σ T_i·S_i·d (QKᵀ and P·V over all heads). The full T·S is counted even with a
//                causal mask, although the executor skips the blocked upper-right key blocks, so
//                causal rows report "equivalent" GFLOP/s comparable with the unmasked ones.
// Softmax, masking and bias are not counted.
//
// Each benchmark run creates its own AttentionExecutor and calls Forward() once before timing, so
// primitive creation and scratch allocation stay outside the timed loop. Times are wall-clock
// (UseRealTime) because oneDNN works on OpenMP threads. BM_Reference rows time the independent
// double-precision reference (tests/reference/) on the smallest case, one iteration per run, for
// scale. Run with tests/benchmarks/run_core_bench.sh for the settings the documented numbers use.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <dnnl.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/forward/attention_batch.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_executor.h"
#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
#include "core/forward/onednn_support.h"
#include "tests/benchmarks/flop_counters.h"
#include "tests/reference/reference_attention.h"

namespace attnserve {
namespace {

constexpr uint64_t kWeightSeed = 2024;

// One benchmarked problem: layer shape, per-sequence lengths and what the call asks for.
struct Case {
  core::AttentionConfig config = {};
  std::vector<int64_t> query_lengths = {};
  std::vector<int64_t> memory_lengths = {};  // Empty for self-attention.
  bool causal = false;
  bool weights_output = false;
};

// Packs lengths into B + 1 row offsets.
std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> offsets{0};
  for (int64_t length : lengths) offsets.push_back(offsets.back() + length);
  return offsets;
}

std::vector<float> RandomRows(int64_t rows, int64_t width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> data(static_cast<size_t>(rows * width));
  for (float& x : data) x = uniform(rng);
  return data;
}

// FLOPs of one forward pass, as described at the top of this file.
double ForwardFlops(const Case& c) {
  const double d = static_cast<double>(c.config.d_model);
  double n = 0, m = 0, scores = 0;
  for (size_t i = 0; i < c.query_lengths.size(); ++i) {
    const double t = static_cast<double>(c.query_lengths[i]);
    const double s = c.memory_lengths.empty() ? t : static_cast<double>(c.memory_lengths[i]);
    n += t;
    m += s;
    scores += t * s;
  }
  const double output_projection = c.config.HasOutputProjection() ? 2 * n * d * d : 0;
  return 2 * n * d * d + 4 * m * d * d + output_projection + 4 * scores * d;
}

// The immutable data of a case, built on first use and shared by all runs of its benchmark.
struct Problem {
  Case spec;
  double flops = 0;
  core::AttentionWeights weights;
  std::shared_ptr<const core::AttentionLayer> layer;
  std::vector<float> query, memory;
  std::vector<int64_t> query_offsets, memory_offsets;

  explicit Problem(Case c) : spec(std::move(c)), flops(ForwardFlops(spec)) {
    weights = core::MakeRandomWeights(spec.config, kWeightSeed);
    auto created = core::AttentionLayer::Create(spec.config, weights);
    if (created.ok()) layer = *std::move(created);
    const int64_t d = spec.config.d_model;
    query_offsets = Offsets(spec.query_lengths);
    query = RandomRows(query_offsets.back(), d, 1);
    if (!spec.memory_lengths.empty()) {
      memory_offsets = Offsets(spec.memory_lengths);
      memory = RandomRows(memory_offsets.back(), d, 2);
    }
  }

  core::AttentionInputs Inputs() const {
    core::AttentionInputs in{.query = {.data = query, .offsets = query_offsets},
                             .mask = {.causal = spec.causal}};
    if (!memory_offsets.empty()) in.memory = core::RaggedBatch{memory, memory_offsets};
    return in;
  }
};

// Builds the case's Problem the first time a run of its benchmark needs it, so that filtered-out
// benchmarks cost nothing.
class LazyProblem {
 public:
  explicit LazyProblem(Case c) : case_(std::move(c)) {}
  const Problem& Get() {
    if (!problem_) problem_ = std::make_unique<Problem>(case_);
    return *problem_;
  }

 private:
  Case case_;
  std::unique_ptr<Problem> problem_;
};

void RunForward(benchmark::State& state, LazyProblem& lazy, const core::ExecutorOptions& options) {
  const Problem& p = lazy.Get();
  if (!p.layer) {
    state.SkipWithError("AttentionLayer::Create failed");
    return;
  }
  core::AttentionExecutor executor(options);
  const core::AttentionInputs in = p.Inputs();
  std::vector<float> output(static_cast<size_t>(in.query.rows() * p.spec.config.d_model));
  std::vector<float> weights(
      p.spec.weights_output ? static_cast<size_t>(core::WeightsSize(p.spec.config, in)) : 0);
  const core::AttentionOutputs out{.output = output, .weights = weights};

  // Warm-up: creates the oneDNN primitives and sizes the scratch buffers.
  if (absl::Status s = executor.Forward(*p.layer, in, out); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    absl::Status s = executor.Forward(*p.layer, in, out);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(output.data());
    benchmark::ClobberMemory();
  }
  SetFlopCounters(state, p.flops);
}

std::string ShapeName(const Case& c) {
  const auto& q = c.query_lengths;
  std::string name = "B:" + std::to_string(q.size());
  bool uniform = true;
  int64_t lo = q.front(), hi = q.front();
  for (int64_t t : q) {
    uniform = uniform && t == q.front();
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  name += "/T:" + (uniform ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi));
  if (!c.memory_lengths.empty()) name += "/S:" + std::to_string(c.memory_lengths.front());
  name += "/d:" + std::to_string(c.config.d_model) + "/h:" + std::to_string(c.config.num_heads) +
          "/causal:" + std::to_string(c.causal ? 1 : 0) +
          "/compute:" + std::string(core::ComputeTypeName(c.config.compute_type));
  return name;
}

// Registers `family`/<shape>/compute:T/threads:N for each thread count, in fp32 and in bf16.
void RegisterForward(const std::string& family, const Case& fp32, std::vector<int> thread_counts) {
  for (core::ComputeType type : {core::ComputeType::kFloat32, core::ComputeType::kBFloat16}) {
    Case c = fp32;
    c.config.compute_type = type;
    auto lazy = std::make_shared<LazyProblem>(c);
    for (int threads : thread_counts) {
      const std::string name = family + "/" + ShapeName(c) + "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [lazy, threads](benchmark::State& state) {
                                     RunForward(state, *lazy, {.compute_threads = threads});
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// Registers BM_TileSize/<shape>/tile_kib:K at 2 threads: how the score tile budget
// (ExecutorOptions::score_tile_bytes) trades cache residency against matmul size.
void RegisterTileSweep(const Case& c) {
  auto lazy = std::make_shared<LazyProblem>(c);
  for (int64_t kib : {512, 2048, 8192, 16384, 32768}) {
    const std::string name = "BM_TileSize/" + ShapeName(c) + "/tile_kib:" + std::to_string(kib);
    benchmark::RegisterBenchmark(
        name.c_str(),
        [lazy, kib](benchmark::State& state) {
          RunForward(state, *lazy, {.compute_threads = 2, .score_tile_bytes = kib << 10});
        })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// Registers BM_HeadTileSize/<shape>/head_tile_kib:K at 2 threads: the per-head score block of
// sequences too long for one score tile (ExecutorOptions::head_tile_bytes) against the L2 cache.
void RegisterHeadTileSweep(const Case& c) {
  auto lazy = std::make_shared<LazyProblem>(c);
  for (int64_t kib : {256, 512, 1024, 2048, 4096, 8192}) {
    const std::string name =
        "BM_HeadTileSize/" + ShapeName(c) + "/head_tile_kib:" + std::to_string(kib);
    benchmark::RegisterBenchmark(name.c_str(),
                                 [lazy, kib](benchmark::State& state) {
                                   RunForward(state, *lazy,
                                              {.compute_threads = 2, .head_tile_bytes = kib << 10});
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// The double-precision reference on the same problem, for scale. It is slow, so few iterations.
void RunReference(benchmark::State& state, LazyProblem& lazy) {
  const Problem& p = lazy.Get();
  const core::AttentionInputs in = p.Inputs();
  for (auto _ : state) {
    absl::StatusOr<reference::ReferenceOutputs> result =
        reference::Attention(p.spec.config, p.weights, in);
    if (!result.ok()) {
      state.SkipWithError(result.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(result->output.data());
  }
  SetFlopCounters(state, p.flops);
}

void RegisterReference(const Case& c) {
  auto lazy = std::make_shared<LazyProblem>(c);
  const std::string name = "BM_Reference/" + ShapeName(c);
  benchmark::RegisterBenchmark(name.c_str(),
                               [lazy](benchmark::State& state) { RunReference(state, *lazy); })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
}

Case Uniform(int64_t batch, int64_t t, int64_t d, int64_t h, bool causal) {
  return Case{.config = {.d_model = d, .num_heads = h},
              .query_lengths = std::vector<int64_t>(static_cast<size_t>(batch), t),
              .causal = causal};
}

// The cost of a batch shape the executor has not seen: two sequence lengths alternate through an
// executor that keeps one shape, with oneDNN's own primitive cache off, so every call creates its
// primitives. Compare with cache:warm, the same calls with every shape cached.
void RunShapeChurn(benchmark::State& state, LazyProblem& first, LazyProblem& second, bool warm) {
  const Problem* problems[2] = {&first.Get(), &second.Get()};
  core::AttentionExecutor executor(
      {.compute_threads = 2, .max_cached_shapes = static_cast<size_t>(warm ? 512 : 1)});
  const int64_t d = problems[0]->spec.config.d_model;
  std::vector<float> output(static_cast<size_t>(
      std::max(problems[0]->query_offsets.back(), problems[1]->query_offsets.back()) * d));
  auto forward = [&](const Problem& p) {
    const core::AttentionInputs in = p.Inputs();
    return executor.Forward(*p.layer, in, {.output = std::span(output).first(in.query.rows() * d)});
  };
  // Warm-up sizes the scratch buffers for both shapes.
  for (const Problem* p : problems) {
    if (absl::Status s = forward(*p); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  const int saved_capacity = dnnl::get_primitive_cache_capacity();
  if (!warm) dnnl::set_primitive_cache_capacity(0);
  int64_t i = 0;
  for (auto _ : state) {
    if (absl::Status s = forward(*problems[i++ % 2]); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::ClobberMemory();
  }
  dnnl::set_primitive_cache_capacity(saved_capacity);
}

void RegisterShapeChurn() {
  auto first = std::make_shared<LazyProblem>(Uniform(1, 200, 512, 8, false));
  auto second = std::make_shared<LazyProblem>(Uniform(1, 201, 512, 8, false));
  for (bool warm : {false, true}) {
    const std::string name = std::string("BM_ShapeChurn/T:200|201/d:512/h:8/threads:2/cache:") +
                             (warm ? "warm" : "cold");
    benchmark::RegisterBenchmark(name.c_str(),
                                 [first, second, warm](benchmark::State& state) {
                                   RunShapeChurn(state, *first, *second, warm);
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// Resident memory of this process, in MiB (VmRSS).
double ResidentMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return 0;
}

// Traffic with many batch shapes, as a server sees it: kBatches ragged batches of 1-4 sequences
// of 8-256 rows each (the soak's mix), one executor. A first batch of the largest shape grows
// the scratch to its working size; `shape_state_MiB` is the resident memory the set-up pass over
// the kBatches batches adds on top (what the per-shape caches cost). The timed loop runs the
// same batches again.
void RunShapeVariety(benchmark::State& state, core::ComputeType type) {
  constexpr int kBatches = 600;
  constexpr int64_t kD = 512;
  core::AttentionConfig config{.d_model = kD, .num_heads = 8, .compute_type = type};
  auto layer = core::AttentionLayer::Create(config, core::MakeRandomWeights(config, kWeightSeed));
  if (!layer.ok()) {
    state.SkipWithError(layer.status().ToString().c_str());
    return;
  }
  std::mt19937_64 rng(7);
  // Every batch's sequence count first, then their lengths (the order the figures were taken in).
  std::vector<size_t> counts(kBatches);
  for (size_t& count : counts) count = std::uniform_int_distribution<size_t>(1, 4)(rng);
  std::vector<std::vector<int64_t>> offsets;
  for (size_t count : counts) {
    std::vector<int64_t> lengths(count);
    for (int64_t& n : lengths) n = std::uniform_int_distribution<int64_t>(8, 256)(rng);
    offsets.push_back(Offsets(lengths));
  }
  const std::vector<float> rows = RandomRows(4 * 256, kD, 1);
  std::vector<float> output(rows.size());
  core::AttentionExecutor executor({.compute_threads = 2});
  auto forward = [&](const std::vector<int64_t>& o) {
    const size_t values = static_cast<size_t>(o.back() * kD);
    const core::AttentionInputs in{.query = {.data = std::span(rows).first(values), .offsets = o}};
    return executor.Forward(**layer, in, {.output = std::span(output).first(values)});
  };
  if (absl::Status s = forward(Offsets({256, 256, 256, 256})); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  const double before = ResidentMiB();
  for (const auto& o : offsets) {
    if (absl::Status s = forward(o); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  // Google Benchmark calls this more than once; later calls find oneDNN's primitive cache and the
  // heap warm, so only the first call's growth says what new shapes cost.
  static std::map<core::ComputeType, double> first_growth;
  first_growth.try_emplace(type, ResidentMiB() - before);
  state.counters["shape_state_MiB"] = first_growth[type];
  size_t i = 0;
  for (auto _ : state) {
    if (absl::Status s = forward(offsets[i++ % offsets.size()]); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::ClobberMemory();
  }
}

void RegisterShapeVariety() {
  for (core::ComputeType type : {core::ComputeType::kFloat32, core::ComputeType::kBFloat16}) {
    const std::string name =
        std::string("BM_ShapeVariety/batches:600/d:512/h:8/threads:2/compute:") +
        (type == core::ComputeType::kFloat32 ? "fp32" : "bf16");
    benchmark::RegisterBenchmark(name.c_str(),
                                 [type](benchmark::State& state) { RunShapeVariety(state, type); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

void RegisterAll() {
  const std::vector<int> kThreads{1, 2};
  struct Shape {
    int64_t batch, t, d, h;
  };
  for (const Shape& s : {Shape{1, 128, 512, 8}, Shape{32, 128, 512, 8}, Shape{8, 512, 512, 8},
                         Shape{1, 2048, 512, 8}, Shape{64, 32, 768, 12}}) {
    for (bool causal : {false, true}) {
      RegisterForward("BM_Forward", Uniform(s.batch, s.t, s.d, s.h, causal), kThreads);
    }
  }

  // Cross-attention: 8 queries of 128 rows over memories of 512 rows.
  Case cross = Uniform(8, 128, 512, 8, false);
  cross.memory_lengths.assign(8, 512);
  RegisterForward("BM_Cross", cross, kThreads);

  // Ragged batch: 32 sequences of lengths 16, 32, ..., 256, 16, 32, ... (no two neighbours equal,
  // so no sequences share a batched primitive).
  Case ragged = Uniform(32, 1, 512, 8, false);
  for (size_t i = 0; i < ragged.query_lengths.size(); ++i) {
    ragged.query_lengths[i] = 16 * static_cast<int64_t>(i % 16 + 1);
  }
  RegisterForward("BM_Ragged", ragged, kThreads);

  // The native single head (3 projections, no W_O).
  Case single = Uniform(1, 128, 512, 1, false);
  single.config.variant = core::AttentionVariant::kSingleHead;
  RegisterForward("BM_SingleHead", single, kThreads);

  // Attention weights requested as an output ([h, T, T] per sequence copied out).
  Case with_weights = Uniform(32, 128, 512, 8, false);
  with_weights.weights_output = true;
  RegisterForward("BM_ForwardWeights", with_weights, kThreads);

  // Score tile budget, on the long-sequence case where it matters.
  for (bool causal : {false, true}) RegisterTileSweep(Uniform(1, 2048, 512, 8, causal));
  for (bool causal : {false, true}) RegisterHeadTileSweep(Uniform(1, 2048, 512, 8, causal));

  // What a never-seen batch shape costs (primitive creation).
  RegisterShapeChurn();
  RegisterShapeVariety();

  // The double-precision reference (single-threaded plain loops), smallest case only.
  for (bool causal : {false, true}) RegisterReference(Uniform(1, 128, 512, 8, causal));
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  benchmark::AddCustomContext("onednn_version", attnserve::core::OneDnnVersion());
  benchmark::AddCustomContext("onednn_isa", attnserve::core::OneDnnIsa());
  attnserve::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
