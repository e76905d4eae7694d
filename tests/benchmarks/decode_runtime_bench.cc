// attnserve_decode_runtime_bench: the decoding runtime (server/decoding) without any wire API —
// 64 sessions at 128 cached tokens, d_model 512, 8 heads, fp32, one-row steps. Each benchmark
// iteration appends one step to every session and waits for all 64 answers:
//   BM_RuntimeDecode/1     continuous batching: the 64 steps share iterations (one forward each)
//   BM_RuntimeDecode/0     batching off: max_iteration_tokens 1, one step per forward
// Wall time (UseRealTime): the loop thread computes, the benchmark thread only appends and waits.
// Counter: tokens/s (items). The sessions' caches grow by one token per iteration; the fixed
// iteration count keeps that growth small (128 -> 128 + 20 + warm-up).
//   BM_PromptDuringDecode/C  the same 64 sessions step round after round (one-row steps, each
//     round waits for its 64 answers) while a 65th session's 2048-token prompt arrives, cut into
//     chunks of C rows (prefill_chunk_tokens C, max_iteration_tokens 2C: every waiting step plus
//     one chunk per iteration). Counters, in ms: the steps' p50/p99 latency (Append to answer)
//     in the rounds that started while the prompt was computing (step_p50_ms, step_p99_ms) and
//     in the rounds before it (idle_p50_ms, idle_p99_ms), and the prompt's completion time
//     (prompt_ms); each benchmark iteration is one fresh run of the scenario, samples pooled.
//     What picks the scheduler's defaults (docs/PERFORMANCE.md).
//   BM_FreshBlocks/M/H  a fresh runtime (--kv-cache-prefault-mb M, huge pages for the arena
//     when H is 1) and 64 sessions prefilled to 64 tokens, then 128 one-row rounds with 1 ms
//     between a round's answers and the next round's steps (the wire and the client, as over
//     gRPC). Every 16th round each session crosses into a block it never had. Counters, in ms:
//     the median compute of those rounds' iterations (fresh_round_ms) and of the others
//     (other_round_ms) — with M = 0 the first pays the page faults of 4 MiB of fresh blocks;
//     with M > 0 the idle loop has mapped them already — and the process's CPU time per round,
//     loop and idle-time mapping included (cpu_per_round_ms).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
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

using SteadyClock = std::chrono::steady_clock;

double Millis(SteadyClock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// The q-quantile (0..1) of `v` (sorted in place); 0 when empty.
double Quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Compute time of iterations with a prefill chunk and of those without, in ms, while recording
// (the rounds; not the sessions' own prefill before them).
class IterationTimes : public decoding::DecodeListener {
 public:
  void OnIteration(const decoding::IterationReport& report) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!recording) return;
    (report.prefill_tokens > 0 ? with_chunk : without_chunk)
        .push_back(static_cast<double>(report.compute_us) / 1000.0);
  }
  void Record(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    recording = on;
  }
  std::mutex mu_;
  bool recording = false;
  std::vector<double> with_chunk, without_chunk;
};

void BM_RuntimeDecode(benchmark::State& state) {
  const bool batching = state.range(0) == 1;
  decoding::DecodeRuntimeOptions options;
  options.compute_threads = 2;
  options.idle_timeout_us = 0;
  if (!batching) options.scheduling = {.max_iteration_tokens = 1, .prefill_chunk_tokens = 1};
  IterationTimes times;
  auto rt = decoding::DecodeRuntime::Create(options, batching::RealClock::Default(), &times);
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
  times.Record(true);
  for (auto _ : state) {
    if (!StepAll(**rt, ids, rows, 1, countdown)) {
      state.SkipWithError("step failed");
      return;
    }
  }
  times.Record(false);
  state.SetItemsProcessed(state.iterations() * kSessions);
  // The forwards' share of a round: the rest is hand-offs, validation and answering.
  double compute_ms = 0;
  for (double ms : times.without_chunk) compute_ms += ms;
  state.counters["compute_ms_per_round"] = compute_ms / static_cast<double>(state.iterations());
}
BENCHMARK(BM_RuntimeDecode)
    ->Arg(1)
    ->Arg(0)
    ->Iterations(20)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

constexpr int64_t kPrompt = 2048;
constexpr int kRoundsBefore = 10;  // Rounds without the prompt (the idle latency).

// One run of the scenario: sessions prefilled to kContext, kRoundsBefore rounds, then the
// prompt arrives and rounds go on until it is answered. Appends each round's step latencies to
// *idle or *during; returns the prompt's completion time in ms (< 0: a failure).
double PromptDuringDecode(int64_t chunk, const std::shared_ptr<const model::Model>& model,
                          std::vector<double>* idle, std::vector<double>* during,
                          IterationTimes* times) {
  decoding::DecodeRuntimeOptions options;
  options.compute_threads = 2;
  options.idle_timeout_us = 0;
  options.scheduling = {.max_iteration_tokens = 2 * chunk, .prefill_chunk_tokens = chunk};
  auto rt = decoding::DecodeRuntime::Create(options, batching::RealClock::Default(), times);
  if (!rt.ok()) return -1;
  std::vector<decoding::SessionId> ids;
  for (int64_t i = 0; i <= kSessions; ++i) {  // The last one gets the prompt.
    auto id = (*rt)->Open({.model = model}, nullptr);
    if (!id.ok()) return -1;
    ids.push_back(*id);
  }
  const decoding::SessionId prompt_session = ids.back();
  ids.pop_back();
  const std::vector<float> rows = Random(kPrompt * kD, 3);
  Countdown countdown;
  if (!StepAll(**rt, ids, rows, kContext, countdown)) return -1;
  times->Record(true);

  std::atomic<bool> prompt_done{false};
  std::atomic<bool> prompt_ok{false};
  SteadyClock::time_point prompt_start, prompt_end;
  std::vector<SteadyClock::time_point> answered(ids.size());
  for (int round = 0; round < 100000; ++round) {
    const bool overlaps = round >= kRoundsBefore && !prompt_done.load();
    if (round == kRoundsBefore) {
      prompt_start = SteadyClock::now();
      decoding::StepRequest prompt{.session = prompt_session,
                                   .rows = rows,
                                   .done = [&](absl::StatusOr<std::vector<float>> r) {
                                     prompt_end = SteadyClock::now();
                                     prompt_ok = r.ok();
                                     prompt_done = true;
                                   }};
      if (!(*rt)->Append(&prompt).ok()) return -1;
    } else if (round > kRoundsBefore && !overlaps) {
      break;
    }
    countdown.Reset(static_cast<int64_t>(ids.size()));
    const SteadyClock::time_point start = SteadyClock::now();
    for (size_t i = 0; i < ids.size(); ++i) {
      decoding::StepRequest request{.session = ids[i],
                                    .rows = std::vector<float>(rows.begin(), rows.begin() + kD),
                                    .done = [&, i](absl::StatusOr<std::vector<float>> r) {
                                      answered[i] = SteadyClock::now();
                                      countdown.Done(r.ok());
                                    }};
      if (!(*rt)->Append(&request).ok()) countdown.Done(false);
    }
    if (!countdown.Wait()) return -1;
    for (const SteadyClock::time_point& t : answered) {
      (overlaps ? during : idle)->push_back(Millis(t - start));
    }
  }
  times->Record(false);
  return prompt_done && prompt_ok ? Millis(prompt_end - prompt_start) : -1;
}

void BM_PromptDuringDecode(benchmark::State& state) {
  const int64_t chunk = state.range(0);
  const auto model = Model();
  if (model == nullptr) {
    state.SkipWithError("setup failed");
    return;
  }
  std::vector<double> idle, during, prompt_ms;
  IterationTimes times;
  for (auto _ : state) {
    const double ms = PromptDuringDecode(chunk, model, &idle, &during, &times);
    if (ms < 0) {
      state.SkipWithError("scenario failed");
      return;
    }
    prompt_ms.push_back(ms);
  }
  state.counters["idle_p50_ms"] = Quantile(idle, 0.5);
  state.counters["idle_p99_ms"] = Quantile(idle, 0.99);
  state.counters["step_p50_ms"] = Quantile(during, 0.5);
  state.counters["step_p99_ms"] = Quantile(during, 0.99);
  state.counters["prompt_ms"] = Quantile(prompt_ms, 0.5);
  state.counters["steps_during"] = static_cast<double>(during.size());
  // Median compute of an iteration carrying a chunk (and the steps waiting then), and of one
  // without: their difference is what one chunk costs the steps.
  state.counters["chunk_iter_ms"] = Quantile(times.with_chunk, 0.5);
  state.counters["step_iter_ms"] = Quantile(times.without_chunk, 0.5);
}
BENCHMARK(BM_PromptDuringDecode)
    ->Arg(64)
    ->Arg(128)
    ->Arg(256)
    ->Arg(512)
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

constexpr int64_t kFreshContext = 64;  // Block-aligned: round 0 takes a fresh block.
constexpr int kFreshRounds = 128;

// Compute ms of each iteration, in order, while recording.
class OrderedTimes : public decoding::DecodeListener {
 public:
  void OnIteration(const decoding::IterationReport& report) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (recording) ms.push_back(static_cast<double>(report.compute_us) / 1000.0);
  }
  void Record(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    recording = on;
  }
  std::mutex mu_;
  bool recording = false;
  std::vector<double> ms;
};

// The process's CPU time (every thread), in ms.
double ProcessCpuMs() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// One run: appends the compute ms of rounds taking fresh blocks to *fresh, of the others to
// *other, and adds the process's CPU ms over the rounds to *cpu_ms. False on a failure.
bool FreshBlocksRun(int64_t prefault_mb, bool huge_pages,
                    const std::shared_ptr<const model::Model>& model, std::vector<double>* fresh,
                    std::vector<double>* other, double* cpu_ms) {
  decoding::DecodeRuntimeOptions options;
  options.compute_threads = 2;
  options.idle_timeout_us = 0;
  options.kv.prefault_ahead_bytes = prefault_mb << 20;
  options.kv.huge_pages = huge_pages;
  OrderedTimes times;
  auto rt = decoding::DecodeRuntime::Create(options, batching::RealClock::Default(), &times);
  if (!rt.ok()) return false;
  std::vector<decoding::SessionId> ids;
  for (int64_t i = 0; i < kSessions; ++i) {
    auto id = (*rt)->Open({.model = model}, nullptr);
    if (!id.ok()) return false;
    ids.push_back(*id);
  }
  const std::vector<float> rows = Random(kFreshContext * kD, 3);
  Countdown countdown;
  if (!StepAll(**rt, ids, rows, kFreshContext, countdown)) return false;
  times.Record(true);
  const double cpu_start_ms = ProcessCpuMs();
  for (int round = 0; round < kFreshRounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!StepAll(**rt, ids, rows, 1, countdown)) return false;
  }
  *cpu_ms += ProcessCpuMs() - cpu_start_ms;
  times.Record(false);
  if (times.ms.size() != static_cast<size_t>(kFreshRounds)) return false;  // One forward a round.
  for (int round = 0; round < kFreshRounds; ++round) {
    ((kFreshContext + round) % 16 == 0 ? fresh : other)->push_back(times.ms[round]);
  }
  return true;
}

void BM_FreshBlocks(benchmark::State& state) {
  const auto model = Model();
  if (model == nullptr) {
    state.SkipWithError("setup failed");
    return;
  }
  std::vector<double> fresh, other;
  double cpu_ms = 0;
  for (auto _ : state) {
    if (!FreshBlocksRun(state.range(0), state.range(1) != 0, model, &fresh, &other, &cpu_ms)) {
      state.SkipWithError("scenario failed");
      return;
    }
  }
  state.counters["fresh_round_ms"] = Quantile(fresh, 0.5);
  state.counters["other_round_ms"] = Quantile(other, 0.5);
  state.counters["cpu_per_round_ms"] =
      cpu_ms / static_cast<double>(state.iterations() * kFreshRounds);
}
BENCHMARK(BM_FreshBlocks)
    ->ArgNames({"prefault_mb", "huge_pages"})
    ->ArgsProduct({{0, 16}, {0, 1}})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attnserve

BENCHMARK_MAIN();
