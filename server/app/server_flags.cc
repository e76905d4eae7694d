#include "server/app/server_flags.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

namespace attnserve::server {
namespace {

// ATTNSERVE_ + the long name in upper case, '-' as '_', for every value flag (not --help, and
// not --config: CLI11 reads the environment after the file).
void AddEnvironmentNames(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    if (option == app.get_help_ptr() || option == app.get_config_ptr() ||
        option->get_lnames().empty()) {
      continue;
    }
    std::string name = "ATTNSERVE_" + option->get_lnames().front();
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
      return c == '-' ? '_' : static_cast<char>(std::toupper(c));
    });
    option->envname(name);
  }
}

}  // namespace

void AddServerFlags(CLI::App& app, ServerFlags& flags) {
  ServerOptions& options = flags.server;
  batching::BatchingOptions& batching = options.model_limits.batching;
  app.set_config("--config", "", "Read flags from this TOML or INI file (key = value per flag)");

  app.add_option("--grpc-address", options.grpc_address,
                 "host:port to serve gRPC on (port 0 = any free port)")
      ->capture_default_str();
  app.add_option("--http-address", options.http.address,
                 "host:port to serve the Open Inference Protocol's HTTP/REST binding on (HTTPS "
                 "with the --tls-* files; port 0 = any free port; \"\" = no REST)")
      ->capture_default_str();
  app.add_option("--http-threads", options.http.threads,
                 "HTTP connections served at once, one worker thread each (kept-alive "
                 "connections hold theirs)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--http-read-timeout-ms", options.http.read_timeout_ms,
                 "An HTTP client silent this long in the middle of a request is disconnected")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--metrics-address", options.metrics_address,
                 "host:port to serve Prometheus metrics on, at /metrics (port 0 = any free "
                 "port; \"\" = no metrics)")
      ->capture_default_str();
  app.add_option(
      "--tls-cert-chain", options.tls.cert_chain_path,
      "PEM certificate chain of the gRPC port (server certificate first); with "
      "--tls-private-key turns on TLS for every service (re-read when the file changes)");
  app.add_option("--tls-private-key", options.tls.private_key_path,
                 "PEM private key of that certificate");
  app.add_option("--tls-client-ca", options.tls.client_ca_path,
                 "PEM CA bundle: turns on mutual TLS, refusing clients without a certificate it "
                 "signed (re-read when the file changes)");
  app.add_option("--tls-refresh-interval-s", options.tls.refresh_interval_s,
                 "Seconds between checks of the TLS files for changes (certificate rotation)")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}))
      ->capture_default_str();
  app.add_option("--model-repository", flags.server.repository.root,
                 "Folder with one sub-folder per model (config.json + weights.safetensors)")
      ->capture_default_str();
  app.add_option("--demo-model", flags.demo_model,
                 "Serve the embedded demo model: auto (only when the repository folder does not "
                 "exist), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  app.add_option("--default-model", options.default_model,
                 "Model answering requests that name none (default: the only model, or demo)");
  app.add_option("--compute-dtype", flags.compute_dtype,
                 "Compute every model folder in fp32 or bf16, overriding config.json's "
                 "compute_dtype, and the demo model's (default: each model's own; demo fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--allow-bf16-emulation", flags.server.repository.load.allow_bf16_emulation,
               "Load bf16 models even on a CPU without native bf16 (AVX512-BF16/AMX), where "
               "oneDNN emulates it more slowly than fp32");
  app.add_option("--model-poll-interval-s", flags.model_poll_interval_s,
                 "Seconds between scans of the repository for added, changed or removed models "
                 "(0 = load once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();

  app.add_option("--max-batch-sequences", batching.max_batch_sequences,
                 "Default most sequences per batch (config.json may override per model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-batch-tokens", batching.max_batch_tokens,
                 "Default most query tokens per batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-queue-delay-us", batching.max_queue_delay_us,
                 "Default longest wait, in microseconds, for a fuller batch (0 = never wait)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-queue-size", batching.max_queue_size,
                 "Default most queued requests per model before RESOURCE_EXHAUSTED")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-queued-bytes-per-model", batching.max_queued_bytes,
                 "Default most bytes of request inputs queued per model before "
                 "RESOURCE_EXHAUSTED (0 = only --max-queued-bytes applies)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-queued-bytes", options.max_queued_bytes,
                 "Most bytes of request inputs queued in all models together before "
                 "RESOURCE_EXHAUSTED (0 = no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--batch-threads", options.num_batch_threads,
                 "Threads forming and running batches, shared by every model (0 = one per "
                 "compute thread)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--max-sequence-length", options.model_limits.request.max_sequence_length,
                 "Default longest query or memory sequence a request may send")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  app.add_option("--compute-threads", options.runner.compute_threads,
                 "Compute threads shared by all batches; one batch uses up to all of them (0 = "
                 "the cores this process may use, or OMP_NUM_THREADS)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--parallel-min-mflop", options.runner.parallel_min_mflop,
                 "Batches with less work (MFLOP) run on one compute thread")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-message-bytes", options.max_message_bytes,
                 "Largest request or response message in bytes")
      ->check(CLI::Range(int64_t{1024}, int64_t{2147483647}))
      ->capture_default_str();

  app.add_option("--shutdown-grace-s", flags.shutdown_grace_s,
                 "On SIGTERM/SIGINT: seconds to answer accepted requests before cancelling what "
                 "is still open")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--max-connection-age-s", flags.max_connection_age_s,
                 "Seconds after which a client connection is asked to reconnect (GOAWAY), so "
                 "clients re-resolve DNS and spread over new replicas (0 = never)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--max-connection-age-grace-s", flags.max_connection_age_grace_s,
                 "After that GOAWAY, seconds that calls already open may still run")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--max-connection-idle-s", flags.max_connection_idle_s,
                 "Seconds a connection with no open call may stay open before it is closed "
                 "(GOAWAY; clients reconnect on their next call; 0 = never)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--malloc-trim-interval-s", flags.malloc_trim_interval_s,
                 "Seconds between hand-backs of the allocator's free memory to the system, so "
                 "resident memory falls after a burst (0 = never)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--keepalive-time-s", flags.keepalive_time_s,
                 "Seconds of silence after which the server pings a connection")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_option("--keepalive-timeout-s", flags.keepalive_timeout_s,
                 "Seconds to wait for that ping's answer before closing the connection")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  app.add_option("--max-concurrent-streams", flags.server.max_concurrent_streams,
                 "Most calls open at once on one client connection (HTTP/2 streams)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-stream-unsent-bytes", flags.server.max_stream_unsent_bytes,
                 "Most bytes of answers an AttendStream holds for a client that does not read "
                 "them; at the limit the server stops reading that stream")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-streams-unsent-bytes", flags.server.max_streams_unsent_bytes,
                 "Most bytes of answers all AttendStreams together hold for clients that do not "
                 "read them")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--grpc-memory-bytes", flags.server.grpc_memory_bytes,
                 "Memory gRPC may use for connection buffers and messages being received (its "
                 "resource quota; 0 = no quota)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grpc-stream-window-bytes", flags.server.grpc_stream_window_bytes,
                 "HTTP/2 flow-control window of each stream: the uploads gRPC buffers for a "
                 "stream that is not reading, and the most a stream moves per round trip")
      ->check(CLI::Range(int64_t{64} << 10, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--kv-cache-budget-mb", flags.kv_cache_budget_mb,
                 "MiB of KV cache all decoding sessions together may hold (Decode); a step past "
                 "it gets RESOURCE_EXHAUSTED. 0 = 1/8 of the container's memory limit, or of RAM "
                 "without one (256 MiB under 2 GiB: 32,768 tokens of d_model 512)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", flags.kv_cache_dtype,
                 "What the KV cache stores for models whose config.json sets no kv_cache_dtype: "
                 "auto (the compute type, fp32 or bf16) or int8 (a scale per token and head: "
                 "half of bf16's bytes, twice the sessions per budget; outputs within ~1e-2)")
      ->check(CLI::IsMember({"auto", "int8"}))
      ->capture_default_str();
  app.add_option("--kv-cache-prefault-mb", flags.kv_cache_prefault_mb,
                 "MiB of KV blocks above the peak in use whose pages the idle decoding loop maps "
                 "ahead of need, so that steps taking fresh blocks do not pay the page faults "
                 "(within the budget; 0 = none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--decode-max-iteration-tokens",
                 flags.server.decoding.scheduling.max_iteration_tokens,
                 "Most rows (decode steps and prefill chunks) per decoding iteration")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--decode-prefill-chunk-tokens",
                 flags.server.decoding.scheduling.prefill_chunk_tokens,
                 "Most prompt rows of one session per decoding iteration (long prompts are cut "
                 "into chunks of this size; at most --decode-max-iteration-tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--decode-gather-delay-us", flags.server.decoding.gather_delay_us,
                 "Microseconds the decoding loop waits for the steps of the sessions the last two "
                 "iterations answered when fewer have arrived (clients of one session each answer "
                 "a little apart); 0 = form each iteration at once")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--decode-idle-timeout-s", flags.decode_idle_timeout_s,
                 "Seconds a decoding session may go without a step before it is closed (0 = "
                 "never)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--decode-max-sessions", flags.server.decoding.max_sessions,
                 "Decoding sessions open at once, all clients together; an open past it gets "
                 "RESOURCE_EXHAUSTED")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--log-level", flags.log_level,
                 "trace, debug (one line per request), info, warn, error, critical, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  app.add_option("--log-format", flags.log_format, "text, or json (one object per line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  AddEnvironmentNames(app);
}

void FinishServerFlags(ServerFlags& flags) {
  static const std::map<std::string, repository::DemoModelPolicy> kPolicies = {
      {"auto", repository::DemoModelPolicy::kWhenNoRepository},
      {"always", repository::DemoModelPolicy::kAlways},
      {"never", repository::DemoModelPolicy::kNever}};
  flags.server.repository.demo_model = kPolicies.at(flags.demo_model);
  if (!flags.compute_dtype.empty()) {
    // Checked by CLI::IsMember, so parsing cannot fail here.
    flags.server.repository.load.compute_type = *core::ParseComputeType(flags.compute_dtype);
  }
  // Checked by CLI::IsMember, so parsing cannot fail here.
  flags.server.repository.load.default_kv_cache_dtype =
      *model::ParseKvCacheDtype(flags.kv_cache_dtype);
  flags.server.model_poll_interval_ms =
      static_cast<int64_t>(std::llround(flags.model_poll_interval_s * 1000.0));
  flags.server.max_connection_age_ms =
      static_cast<int64_t>(std::llround(flags.max_connection_age_s * 1000.0));
  flags.server.max_connection_age_grace_ms =
      static_cast<int64_t>(std::llround(flags.max_connection_age_grace_s * 1000.0));
  flags.server.max_connection_idle_ms =
      static_cast<int64_t>(std::llround(flags.max_connection_idle_s * 1000.0));
  flags.server.malloc_trim_interval_ms =
      static_cast<int64_t>(std::llround(flags.malloc_trim_interval_s * 1000.0));
  flags.server.keepalive_time_ms =
      static_cast<int64_t>(std::llround(flags.keepalive_time_s * 1000.0));
  flags.server.keepalive_timeout_ms =
      static_cast<int64_t>(std::llround(flags.keepalive_timeout_s * 1000.0));
  flags.server.decoding.kv.budget_bytes = flags.kv_cache_budget_mb << 20;
  flags.server.decoding.kv.prefault_ahead_bytes = flags.kv_cache_prefault_mb << 20;
  flags.server.decoding.idle_timeout_us =
      static_cast<int64_t>(std::llround(flags.decode_idle_timeout_s * 1e6));
}

}  // namespace attnserve::server
