// attnserve_offline_bench: the core alone, the baseline the server benchmarks compare with. No
// server, no gRPC: core::AttentionExecutor::Forward back to back on the embedded demo model over a
// ragged batch of B equal-length sequences of T rows, at a given compute-thread count. Reports
// ms per pass (p50, mean, min, max), sequences/s and tokens/s.
//
//   attnserve_offline_bench [--seq-len 128] [--sequences 1] [--duration-s 5] [--iterations 0]
//                           [--warmup-iterations 3] [--compute-threads 0] [--pause-us 0]
//                           [--causal] [--json]
//
// With --json, one object: "mode" ("offline"), "sequences", "seq_len", "causal",
// "compute_threads", "pause_us", "iterations" (timed passes), "elapsed_s", "p50_ms", "mean_ms",
// "min_ms", "max_ms", "sequences_per_s", "tokens_per_s", "cpu_s" (this process, user + system).
// The input is deterministic (the same values every run). Exit status: 0 on success, 1 when a
// timed pass fails, 2 when the run could not start (bad flags, no demo model, a failing warm-up).
// run_server_bench.sh runs it next to the server scenarios (attnserve-cli bench).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/cli/load_stats.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_executor.h"
#include "core/model/model.h"

namespace attnserve::offline_bench {
namespace {

using load::LoadClock;

struct Flags {
  int64_t seq_len = 128;
  int64_t sequences = 1;
  double duration_s = 5;
  int64_t iterations = 0;
  int64_t warmup_iterations = 3;
  int compute_threads = 0;
  int64_t pause_us = 0;
  bool causal = false;
  bool json = false;
  std::string compute_dtype = "fp32";
};

// Deterministic inputs in [-1, 1): the same bytes on every run.
std::vector<float> Payload(int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  uint32_t state = 20261129;
  for (float& value : values) {
    state = state * 1664525u + 1013904223u;
    value = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return values;
}

int Run(const Flags& flags) {
  if (flags.iterations <= 0 && flags.duration_s <= 0) {
    std::fprintf(stderr, "attnserve_offline_bench: give --iterations or --duration-s (or both)\n");
    return 2;
  }
  absl::StatusOr<std::shared_ptr<const model::Model>> demo =
      model::DemoModel(*core::ParseComputeType(flags.compute_dtype));
  if (!demo.ok()) {
    std::fprintf(stderr, "attnserve_offline_bench: demo model: %s\n",
                 std::string(demo.status().ToString()).c_str());
    return 2;
  }
  const core::AttentionLayer& layer = *(*demo)->layer;
  const int64_t d_model = (*demo)->config.attention.d_model;
  const int64_t rows = flags.sequences * flags.seq_len;
  const std::vector<float> input = Payload(rows * d_model);
  std::vector<float> output(static_cast<size_t>(rows * d_model));
  std::vector<int64_t> offsets{0};
  for (int64_t i = 0; i < flags.sequences; ++i) offsets.push_back(offsets.back() + flags.seq_len);
  const core::AttentionInputs in{.query = {.data = input, .offsets = offsets},
                                 .mask = {.causal = flags.causal}};
  core::AttentionExecutor executor({.compute_threads = flags.compute_threads});

  for (int64_t i = 0; i < flags.warmup_iterations; ++i) {
    if (absl::Status s = executor.Forward(layer, in, {.output = output}); !s.ok()) {
      std::fprintf(stderr, "attnserve_offline_bench: Forward: %s\n",
                   std::string(s.ToString()).c_str());
      return 2;
    }
  }
  std::vector<double> passes_ms;
  const LoadClock::time_point start = LoadClock::now();
  const double start_cpu_s = load::ProcessCpuSeconds();
  const auto deadline = start + std::chrono::milliseconds(
                                    static_cast<int64_t>(std::llround(flags.duration_s * 1000.0)));
  while ((flags.iterations <= 0 || static_cast<int64_t>(passes_ms.size()) < flags.iterations) &&
         (flags.duration_s <= 0 || passes_ms.empty() || LoadClock::now() < deadline)) {
    const LoadClock::time_point pass_start = LoadClock::now();
    if (absl::Status s = executor.Forward(layer, in, {.output = output}); !s.ok()) {
      std::fprintf(stderr, "attnserve_offline_bench: Forward: %s\n",
                   std::string(s.ToString()).c_str());
      return 1;
    }
    passes_ms.push_back(load::MillisBetween(pass_start, LoadClock::now()));
    if (flags.pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(flags.pause_us));
  }
  const double elapsed_s = std::chrono::duration<double>(LoadClock::now() - start).count();
  const double cpu_s = load::ProcessCpuSeconds() - start_cpu_s;
  const double n = static_cast<double>(passes_ms.size());
  double mean_ms = 0;
  for (double ms : passes_ms) mean_ms += ms / n;
  std::sort(passes_ms.begin(), passes_ms.end());
  const double p50_ms = load::Percentile(passes_ms, 0.5);
  const double sequences_per_s = static_cast<double>(flags.sequences) * n / elapsed_s;
  const double tokens_per_s = sequences_per_s * static_cast<double>(flags.seq_len);

  if (flags.json) {
    std::printf(
        "{\"mode\": \"offline\", \"sequences\": %lld, \"seq_len\": %lld, "
        "\"causal\": %s, \"compute_dtype\": \"%s\", \"compute_threads\": %d, \"pause_us\": %lld, "
        "\"iterations\": %lld, "
        "\"elapsed_s\": %.4f, \"p50_ms\": %.4f, \"mean_ms\": %.4f, \"min_ms\": %.4f, "
        "\"max_ms\": %.4f, \"sequences_per_s\": %.2f, \"tokens_per_s\": %.1f, "
        "\"cpu_s\": %.3f}\n",
        static_cast<long long>(flags.sequences), static_cast<long long>(flags.seq_len),
        flags.causal ? "true" : "false", flags.compute_dtype.c_str(), flags.compute_threads,
        static_cast<long long>(flags.pause_us), static_cast<long long>(passes_ms.size()), elapsed_s,
        p50_ms, mean_ms, passes_ms.front(), passes_ms.back(), sequences_per_s, tokens_per_s, cpu_s);
  } else {
    std::printf(
        "attnserve_offline_bench: demo model (d_model %lld), B=%lld T=%lld%s, "
        "compute threads %d (0 = default)\n",
        static_cast<long long>(d_model), static_cast<long long>(flags.sequences),
        static_cast<long long>(flags.seq_len), flags.causal ? " causal" : "",
        flags.compute_threads);
    std::printf("passes          %lld in %.2f s\n", static_cast<long long>(passes_ms.size()),
                elapsed_s);
    std::printf("ms per pass     p50 %.3f  mean %.3f  min %.3f  max %.3f\n", p50_ms, mean_ms,
                passes_ms.front(), passes_ms.back());
    std::printf("throughput      %.1f sequences/s, %.0f tokens/s (CPU %.2f s)\n", sequences_per_s,
                tokens_per_s, cpu_s);
  }
  return 0;
}

}  // namespace
}  // namespace attnserve::offline_bench

int main(int argc, char** argv) {
  attnserve::offline_bench::Flags flags;
  CLI::App app{
      "attnserve_offline_bench: the core alone, Forward back to back on the demo model (no "
      "server), the baseline of run_server_bench.sh"};
  app.add_option("--seq-len", flags.seq_len, "T: tokens per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--sequences", flags.sequences, "B: sequences per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--duration-s", flags.duration_s, "Time budget (0 = no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--iterations", flags.iterations, "Passes (0 = no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--warmup-iterations", flags.warmup_iterations, "Untimed passes first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--compute-threads", flags.compute_threads,
                 "OpenMP threads per pass (0 = OMP_NUM_THREADS, else one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--pause-us", flags.pause_us,
                 "Sleep between passes, as a server between requests at low load (idle OpenMP "
                 "workers then go to sleep); sequences/s and tokens/s then count the pauses")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--causal", flags.causal, "Causal mask");
  app.add_option("--compute-dtype", flags.compute_dtype,
                 "The demo model's compute type, as the server's --compute-dtype")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_flag("--json", flags.json, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);
  return attnserve::offline_bench::Run(flags);
}
