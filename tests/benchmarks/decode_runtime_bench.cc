// attnserve_decode_runtime_bench: the decoding runtime (server/decoding) without any wire API —
// 64 sessions at 128 cached tokens, d_model 512, 8 heads, fp32, one-row steps. Each benchmark
// iteration appends one step to every session and waits for all 64 answers:
//   BM_RuntimeDecode/1     continuous batching: the 64 steps share iterations (one forward each)
//   BM_RuntimeDecode/0     batching off: max_iteration_tokens 1, one step per forward
// Wall time (UseRealTime): the loop thread computes, the benchmark thread only appends and waits.
// Counter: tokens/s (items). The sessions' caches grow by one token per iteration; the fixed
// iteration count keeps that growth small (128 -> 128 + 20 + warm-up).
#include <benchmark/benchmark.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "core/attention_layer.h"
#include "core/attention_weights.h"
#include "core/model/model.h"
#include "server/decoding/decode_runtime.h"

namespace attnserve {
namespace {

constexpr int64_t kD = 512, kHeads = 8, kSessions = 64, kContext = 128;

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::shared_ptr<const model::Model> Model() {
  auto m = std::make_shared<model::Model>();
  m->name = "bench";
  m->config.attention = {.d_model = kD, .num_heads = kHeads};
  core::AttentionWeights w;
  w.w_qkv = Random(kD * 3 * kD, 1);
  w.w_o = Random(kD * kD, 2);
  for (float& x : w.w_qkv) x *= 0.05f;
  for (float& x : w.w_o) x *= 0.05f;
  auto layer = core::AttentionLayer::Create(m->config.attention, w);
  if (!layer.ok()) return nullptr;
  m->layer = *layer;
  return m;
}

// Counts answers; Wait blocks until `n` arrived since the last Reset.
class Countdown {
 public:
  void Reset(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    left_ = n;
    failed_ = false;
  }
  void Done(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = failed_ || !ok;
    if (--left_ == 0) cv_.notify_all();
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return left_ == 0; });
    return !failed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t left_ = 0;
  bool failed_ = false;
};

// Appends rows[i] to session ids[i] for every i and waits for every answer.
bool StepAll(decoding::DecodeRuntime& rt, const std::vector<decoding::SessionId>& ids,
             const std::vector<float>& row, int64_t rows, Countdown& countdown) {
  countdown.Reset(static_cast<int64_t>(ids.size()));
  rt.Pause();  // Every session's step is waiting when the iteration forms, as with 64 clients.
  for (decoding::SessionId id : ids) {
    decoding::StepRequest request{
        .session = id,
        .rows = std::vector<float>(row.begin(), row.begin() + rows * kD),
        .done = [&countdown](absl::StatusOr<std::vector<float>> r) { countdown.Done(r.ok()); }};
    if (!rt.Append(&request).ok()) countdown.Done(false);
  }
  rt.Resume();
  return countdown.Wait();
}

void BM_RuntimeDecode(benchmark::State& state) {
  const bool batching = state.range(0) == 1;
  decoding::DecodeRuntimeOptions options;
  options.compute_threads = 2;
  options.idle_timeout_us = 0;
  if (!batching) options.scheduling = {.max_iteration_tokens = 1, .prefill_chunk_tokens = 1};
  auto rt = decoding::DecodeRuntime::Create(options);
  const auto model = Model();
  if (!rt.ok() || model == nullptr) {
    state.SkipWithError("setup failed");
    return;
  }
  std::vector<decoding::SessionId> ids;
  for (int64_t i = 0; i < kSessions; ++i) {
    auto id = (*rt)->Open({.model = model}, nullptr);
    if (!id.ok()) {
      state.SkipWithError("open failed");
      return;
    }
    ids.push_back(*id);
  }
  const std::vector<float> rows = Random(kContext * kD, 3);
  Countdown countdown;
  if (!StepAll(**rt, ids, rows, kContext, countdown)) {
    state.SkipWithError("prefill failed");
    return;
  }
  for (auto _ : state) {
    if (!StepAll(**rt, ids, rows, 1, countdown)) {
      state.SkipWithError("step failed");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations() * kSessions);
}
BENCHMARK(BM_RuntimeDecode)
    ->Arg(1)
    ->Arg(0)
    ->Iterations(20)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attnserve

BENCHMARK_MAIN();
