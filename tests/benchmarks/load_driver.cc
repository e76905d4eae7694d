// attnserve_load: a small closed-loop load driver for the attnserve gRPC server, and the core's
// offline baseline to compare it with.
//
//   attnserve_load run [--target 127.0.0.1:50051] [--seq-len 16] [--sequences 1]
//                      [--concurrency 64] [--requests N] [--duration-s 10] [--stream] [--json] ...
//       Keeps --concurrency Attend calls (or AttendStream messages with --stream) in flight
//       against a server, through gRPC's callback client API (load_client.h), after
//       --warmup-requests uncounted ones. Reports OK requests, errors by gRPC code, requests/s,
//       tokens/s, client-side latency percentiles and the means of the answers' Timing.
//   attnserve_load offline [--seq-len 128] [--sequences 1] [--duration-s 5] [--compute-threads 0]
//       No server: core::AttentionExecutor::Forward back to back on the embedded demo model over
//       a ragged batch of --sequences equal-length sequences; ms per pass, sequences/s, tokens/s.
//
// The payload is deterministic (the same request every time), sent as Tensor.raw with
// raw_output (or as Tensor.values both ways with --values). Exit status: 0 when every measured
// request succeeded, 1 when some failed, 2 when the run could not start (bad flags, no server).
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "attnserve/v1/attention.grpc.pb.h"
#include "client/cli/load_stats.h"
#include "core/attention_batch.h"
#include "core/attention_executor.h"
#include "core/model/model.h"
#include "tests/benchmarks/load_client.h"

namespace attnserve::load {
namespace {

struct RunFlags {
  std::string target = "127.0.0.1:50051";
  std::string model;
  int64_t seq_len = 16;
  int64_t sequences = 1;
  int concurrency = 64;
  int64_t requests = 0;
  double duration_s = 10;
  int64_t warmup_requests = 100;
  bool stream = false;
  int streams = 1;
  bool values = false;
  bool causal = false;
  int channels = 1;
  double timeout_s = 30;
  double connect_timeout_s = 10;
  bool json = false;
};

struct OfflineFlags {
  int64_t seq_len = 128;
  int64_t sequences = 1;
  double duration_s = 5;
  int64_t iterations = 0;
  int64_t warmup_iterations = 3;
  int compute_threads = 0;
  int64_t pause_us = 0;
  bool causal = false;
  bool json = false;
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

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // A distinct argument and a local subchannel pool: each channel gets its own connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("attnserve.load_channel", index);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

void PrintRunText(const RunFlags& flags, const v1::ModelInfo& info, const LoadSummary& s) {
  std::printf(
      "attnserve_load run: %s, model %s (d_model %d), B=%lld T=%lld, %s, %s, "
      "concurrency %d, %d channel(s)\n",
      flags.target.c_str(), info.name().c_str(), info.d_model(),
      static_cast<long long>(flags.sequences), static_cast<long long>(flags.seq_len),
      flags.stream ? ("stream x" + std::to_string(flags.streams)).c_str() : "unary",
      flags.values ? "values" : "raw", flags.concurrency, flags.channels);
  std::string errors;
  for (const auto& [name, count] : s.errors) {
    errors += (errors.empty() ? "" : ", ") + name + " " + std::to_string(count);
  }
  std::printf("requests OK     %lld in %.2f s (errors: %s)\n", static_cast<long long>(s.ok),
              s.elapsed_s, errors.empty() ? "none" : errors.c_str());
  std::printf("throughput      %.1f req/s, %.0f tokens/s\n", s.rps, s.tokens_per_s);
  std::printf("latency ms      p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  (mean %.3f)\n",
              s.p50_ms, s.p90_ms, s.p99_ms, s.p999_ms, s.max_ms, s.mean_ms);
  std::printf(
      "server Timing   mean batch_sequences %.2f, batch_tokens %.1f, queue_us %.0f, "
      "compute_us %.0f\n",
      s.mean_batch_sequences, s.mean_batch_tokens, s.mean_queue_us, s.mean_compute_us);
  std::printf(
      "batches         %.0f, %.2f sequences per batch; server in Forward %.1f %% of the "
      "time\n",
      s.batches, s.batch_mean_sequences, 100.0 * s.compute_busy);
  std::printf("client CPU      %.2f s (%.0f us per OK request)\n", s.client_cpu_s,
              s.ok > 0 ? s.client_cpu_s * 1e6 / static_cast<double>(s.ok) : 0.0);
}

void PrintRunJson(const RunFlags& flags, const v1::ModelInfo& info, const LoadSummary& s) {
  std::string errors;
  for (const auto& [name, count] : s.errors) {
    errors += (errors.empty() ? "" : ", ") + JsonString(name) + ": " + std::to_string(count);
  }
  std::printf(
      "{\"mode\": \"run\", \"target\": %s, \"model\": %s, \"d_model\": %d, \"sequences\": %lld, "
      "\"seq_len\": %lld, \"concurrency\": %d, \"stream\": %s, \"streams\": %d, \"raw\": %s, "
      "\"causal\": %s, \"channels\": %d, \"requests_ok\": %lld, \"errors\": {%s}, "
      "\"elapsed_s\": %.4f, \"rps\": %.2f, \"tokens_per_s\": %.1f, "
      "\"latency_ms\": {\"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f, \"p999\": %.4f, "
      "\"max\": %.4f, \"mean\": %.4f}, "
      "\"server_timing\": {\"mean_batch_sequences\": %.3f, \"mean_batch_tokens\": %.2f, "
      "\"mean_queue_us\": %.1f, \"mean_compute_us\": %.1f, \"batches\": %.1f, "
      "\"batch_mean_sequences\": %.3f, \"compute_busy\": %.4f}, \"client_cpu_s\": %.3f}\n",
      JsonString(flags.target).c_str(), JsonString(info.name()).c_str(), info.d_model(),
      static_cast<long long>(flags.sequences), static_cast<long long>(flags.seq_len),
      flags.concurrency, flags.stream ? "true" : "false", flags.streams,
      flags.values ? "false" : "true", flags.causal ? "true" : "false", flags.channels,
      static_cast<long long>(s.ok), errors.c_str(), s.elapsed_s, s.rps, s.tokens_per_s, s.p50_ms,
      s.p90_ms, s.p99_ms, s.p999_ms, s.max_ms, s.mean_ms, s.mean_batch_sequences,
      s.mean_batch_tokens, s.mean_queue_us, s.mean_compute_us, s.batches, s.batch_mean_sequences,
      s.compute_busy, s.client_cpu_s);
}

int Run(RunFlags flags) {
  if (flags.requests <= 0 && flags.duration_s <= 0) {
    std::fprintf(stderr, "attnserve_load run: give --requests or --duration-s (or both)\n");
    return 2;
  }
  flags.streams = std::min(flags.streams, flags.concurrency);

  std::vector<std::unique_ptr<Stub>> stubs;
  for (int i = 0; i < flags.channels; ++i) {
    stubs.push_back(v1::AttentionService::NewStub(MakeChannel(flags.target, i)));
  }
  // Ask the model for its width; this also waits for the server and connects every channel.
  v1::ModelInfo info;
  for (auto& stub : stubs) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() + Millis(flags.connect_timeout_s));
    v1::GetModelRequest request;
    request.set_name(flags.model);
    grpc::Status status = stub->GetModel(&context, request, &info);
    if (!status.ok()) {
      std::fprintf(stderr, "attnserve_load run: GetModel(\"%s\") on %s failed: %s: %s\n",
                   flags.model.c_str(), flags.target.c_str(),
                   StatusCodeName(status.error_code()).c_str(), status.error_message().c_str());
      return 2;
    }
  }

  const int64_t d_model = info.d_model();
  const std::vector<float> payload = Payload(flags.sequences * flags.seq_len * d_model);
  v1::AttendRequest request;
  request.set_model(flags.model);
  v1::Tensor* input = request.mutable_input();
  if (flags.sequences > 1) input->add_shape(flags.sequences);
  input->add_shape(flags.seq_len);
  input->add_shape(d_model);
  if (flags.values) {
    input->mutable_values()->Add(payload.begin(), payload.end());
  } else {
    input->set_raw(
        std::string(reinterpret_cast<const char*>(payload.data()), payload.size() * sizeof(float)));
    request.set_raw_output(true);
  }
  if (flags.causal) request.set_mask(v1::MASK_CAUSAL);

  auto run_phase = [&](LoadBudget* budget, LoadRecorder* recorder) {
    const auto timeout = Millis(flags.timeout_s + (flags.stream ? flags.duration_s : 0));
    if (flags.stream) {
      RunStreamLoad(stubs, request, flags.concurrency, flags.streams, timeout, budget, recorder);
    } else {
      RunUnaryLoad(stubs, request, flags.concurrency, timeout, budget, recorder);
    }
  };
  const int64_t tokens_per_request = flags.sequences * flags.seq_len;
  if (flags.warmup_requests > 0) {
    LoadBudget warmup_budget(flags.warmup_requests, std::nullopt);
    LoadRecorder warmup(flags.sequences, tokens_per_request);
    warmup.Start();
    run_phase(&warmup_budget, &warmup);
  }
  std::optional<LoadClock::time_point> deadline;
  if (flags.duration_s > 0) deadline = LoadClock::now() + Millis(flags.duration_s);
  LoadBudget budget(flags.requests, deadline);
  LoadRecorder recorder(flags.sequences, tokens_per_request);
  recorder.Start();
  run_phase(&budget, &recorder);
  const LoadSummary summary = recorder.Finish();

  if (flags.json) {
    PrintRunJson(flags, info, summary);
  } else {
    PrintRunText(flags, info, summary);
  }
  return summary.errors.empty() && summary.ok > 0 ? 0 : 1;
}

int Offline(const OfflineFlags& flags) {
  if (flags.iterations <= 0 && flags.duration_s <= 0) {
    std::fprintf(stderr, "attnserve_load offline: give --iterations or --duration-s (or both)\n");
    return 2;
  }
  absl::StatusOr<std::shared_ptr<const model::Model>> demo = model::DemoModel();
  if (!demo.ok()) {
    std::fprintf(stderr, "attnserve_load offline: demo model: %s\n",
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
      std::fprintf(stderr, "attnserve_load offline: Forward: %s\n",
                   std::string(s.ToString()).c_str());
      return 2;
    }
  }
  std::vector<double> passes_ms;
  const LoadClock::time_point start = LoadClock::now();
  const double start_cpu_s = ProcessCpuSeconds();
  const auto deadline = start + Millis(flags.duration_s);
  while ((flags.iterations <= 0 || static_cast<int64_t>(passes_ms.size()) < flags.iterations) &&
         (flags.duration_s <= 0 || passes_ms.empty() || LoadClock::now() < deadline)) {
    const LoadClock::time_point pass_start = LoadClock::now();
    if (absl::Status s = executor.Forward(layer, in, {.output = output}); !s.ok()) {
      std::fprintf(stderr, "attnserve_load offline: Forward: %s\n",
                   std::string(s.ToString()).c_str());
      return 1;
    }
    passes_ms.push_back(MillisBetween(pass_start, LoadClock::now()));
    if (flags.pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(flags.pause_us));
  }
  const double elapsed_s = std::chrono::duration<double>(LoadClock::now() - start).count();
  const double cpu_s = ProcessCpuSeconds() - start_cpu_s;
  const double n = static_cast<double>(passes_ms.size());
  double mean_ms = 0;
  for (double ms : passes_ms) mean_ms += ms / n;
  std::sort(passes_ms.begin(), passes_ms.end());
  const double p50_ms = Percentile(passes_ms, 0.5);
  const double sequences_per_s = static_cast<double>(flags.sequences) * n / elapsed_s;
  const double tokens_per_s = sequences_per_s * static_cast<double>(flags.seq_len);

  if (flags.json) {
    std::printf(
        "{\"mode\": \"offline\", \"sequences\": %lld, \"seq_len\": %lld, "
        "\"causal\": %s, \"compute_threads\": %d, \"pause_us\": %lld, \"iterations\": %lld, "
        "\"elapsed_s\": %.4f, \"p50_ms\": %.4f, \"mean_ms\": %.4f, \"min_ms\": %.4f, "
        "\"max_ms\": %.4f, \"sequences_per_s\": %.2f, \"tokens_per_s\": %.1f, "
        "\"cpu_s\": %.3f}\n",
        static_cast<long long>(flags.sequences), static_cast<long long>(flags.seq_len),
        flags.causal ? "true" : "false", flags.compute_threads,
        static_cast<long long>(flags.pause_us), static_cast<long long>(passes_ms.size()), elapsed_s,
        p50_ms, mean_ms, passes_ms.front(), passes_ms.back(), sequences_per_s, tokens_per_s, cpu_s);
  } else {
    std::printf(
        "attnserve_load offline: demo model (d_model %lld), B=%lld T=%lld%s, "
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
}  // namespace attnserve::load

int main(int argc, char** argv) {
  // Holds gRPC's library reference for the whole process. Otherwise the last channel's
  // destructor runs grpc_shutdown(), which joins an executor thread that may be sitting in a
  // 10 s epoll_wait (gRPC 1.51): seen as a 10 s stall at exit in about one run in four.
  grpc_init();
  using attnserve::load::OfflineFlags;
  using attnserve::load::RunFlags;
  CLI::App app{
      "attnserve_load: closed-loop load against an attnserve server, and the core's "
      "offline baseline"};
  app.require_subcommand(1);

  RunFlags run;
  CLI::App* run_cmd = app.add_subcommand(
      "run", "Closed-loop load: keep --concurrency requests in flight against a server");
  run_cmd->add_option("--target", run.target, "host:port of the server")->capture_default_str();
  run_cmd->add_option("--model", run.model, "Model name (\"\" = the server's default model)");
  run_cmd->add_option("--seq-len", run.seq_len, "T: tokens per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  run_cmd
      ->add_option("--sequences", run.sequences,
                   "B: sequences per request (input [B, T, d] when > 1, else [T, d])")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  run_cmd->add_option("--concurrency", run.concurrency, "Requests in flight")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  run_cmd->add_option("--requests", run.requests, "Stop after this many requests (0 = no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run_cmd->add_option("--duration-s", run.duration_s, "Stop sending after this long (0 = no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run_cmd
      ->add_option("--warmup-requests", run.warmup_requests, "Requests sent first and not counted")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run_cmd->add_flag("--stream", run.stream,
                    "Use AttendStream: --streams streams share the concurrency, each keeping its "
                    "share of messages outstanding");
  run_cmd->add_option("--streams", run.streams, "Streams with --stream")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  run_cmd->add_flag("--values", run.values,
                    "Send Tensor.values and take values back (default: raw both ways)");
  run_cmd->add_flag("--causal", run.causal, "Ask for the causal mask");
  run_cmd->add_option("--channels", run.channels, "gRPC channels (connections) to spread over")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  run_cmd->add_option("--timeout-s", run.timeout_s, "Deadline of each unary call")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  run_cmd
      ->add_option("--connect-timeout-s", run.connect_timeout_s,
                   "How long to wait for the server to answer GetModel at start")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  run_cmd->add_flag("--json", run.json, "Print one JSON object");

  OfflineFlags offline;
  CLI::App* offline_cmd = app.add_subcommand(
      "offline", "The core alone: Forward back to back on the demo model, no server");
  offline_cmd->add_option("--seq-len", offline.seq_len, "T: tokens per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  offline_cmd->add_option("--sequences", offline.sequences, "B: sequences per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  offline_cmd->add_option("--duration-s", offline.duration_s, "Time budget (0 = no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  offline_cmd->add_option("--iterations", offline.iterations, "Passes (0 = no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  offline_cmd->add_option("--warmup-iterations", offline.warmup_iterations, "Untimed passes first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  offline_cmd
      ->add_option("--compute-threads", offline.compute_threads,
                   "OpenMP threads per pass (0 = OMP_NUM_THREADS, else one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  offline_cmd
      ->add_option("--pause-us", offline.pause_us,
                   "Sleep between passes, as a server between requests at low load (idle OpenMP "
                   "workers then go to sleep); sequences/s and tokens/s then count the pauses")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  offline_cmd->add_flag("--causal", offline.causal, "Causal mask");
  offline_cmd->add_flag("--json", offline.json, "Print one JSON object");

  CLI11_PARSE(app, argc, argv);
  if (run_cmd->parsed()) return attnserve::load::Run(run);
  return attnserve::load::Offline(offline);
}
