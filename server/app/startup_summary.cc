#include "server/app/startup_summary.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/version.h"
#include "core/forward/attention_config.h"
#include "core/forward/onednn_support.h"
#include "core/kv_cache/int8_dot_kernel.h"
#include "server/app/tls_credentials.h"
#include "server/runtime/compute_budget.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

// Where the serving models come from, e.g. "2 from repository models" or "no repository folder
// models; the embedded demo model".
std::string ModelSources(const std::vector<ModelRoute>& models, const std::filesystem::path& root) {
  const auto embedded = std::count_if(models.begin(), models.end(), [](const ModelRoute& route) {
    return route.model->source == "embedded";
  });
  std::error_code error;
  if (!std::filesystem::is_directory(root, error)) {
    return absl::StrCat("no repository folder ", root.string(),
                        embedded > 0 ? "; the embedded demo model" : "");
  }
  return absl::StrCat(static_cast<int64_t>(models.size()) - embedded, " from repository ",
                      root.string(), embedded > 0 ? ", plus the embedded demo model" : "");
}

std::string EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

}  // namespace

std::string VersionText(std::string_view git_revision) {
  return absl::StrCat("attnserve ", kVersion, " (git ", std::string(git_revision), ")\noneDNN ",
                      core::OneDnnVersion(), " (ISA ", core::OneDnnIsa(), ")\ngRPC ",
                      grpc::Version());
}

void LogStartupSummary(Server& server, const ServerOptions& options) {
  spdlog::info("attnserve {} (git {})", kVersion, options.git_revision);
  // Show the port actually bound (the address may have asked for port 0).
  const std::string& address = options.grpc_address;
  const std::string host = address.substr(0, address.rfind(':'));
  spdlog::info("attnserve listening on {}:{} (port {}); health and reflection enabled", host,
               server.port(), server.port());
  spdlog::info("gRPC port security: {}", DescribeTls(options.tls));
  if (server.http_port() != 0) {
    const std::string& http = options.http.address;
    spdlog::info("Open Inference Protocol REST at {}://{}:{}/v2 ({} connections at once)",
                 TlsEnabled(options.tls) ? "https" : "http", http.substr(0, http.rfind(':')),
                 server.http_port(), options.http.threads);
  } else {
    spdlog::info("REST off (--http-address \"\")");
  }
  if (server.metrics_port() != 0) {
    const std::string& metrics = options.metrics_address;
    spdlog::info("metrics at http://{}:{}/metrics", metrics.substr(0, metrics.rfind(':')),
                 server.metrics_port());
  } else {
    spdlog::info("metrics off (--metrics-address \"\")");
  }
  if (options.max_connection_age_ms > 0) {
    spdlog::info("connections aged out after {} ms (GOAWAY; open calls get {} ms more)",
                 options.max_connection_age_ms, options.max_connection_age_grace_ms);
  }
  const std::vector<ModelRoute> models = server.router().Routes();
  spdlog::info("{} model(s) serving: {}", models.size(),
               ModelSources(models, options.repository.root));
  for (const ModelRoute& route : models) {
    const model::Model& model = *route.model;
    const core::AttentionConfig& config = model.config.attention;
    const ModelLimits& limits = route.limits;
    spdlog::info(
        "model {}{} v{}: d_model={} heads={} {} bias={} {} kv_cache={} parameters={} source={} | "
        "max_sequence_length={} batching: max_batch_sequences={} max_batch_tokens={} "
        "max_queue_delay_us={} max_queue_size={} max_queued_bytes={}",
        model.name, route.is_default ? " (default)" : "", model.version, config.d_model,
        config.num_heads, core::VariantName(config.variant), config.bias,
        core::ComputeTypeName(config.compute_type), model::KvCacheStorageName(model.config),
        config.ParameterCount(), model.source, limits.request.max_sequence_length,
        limits.batching.max_batch_sequences, limits.batching.max_batch_tokens,
        limits.batching.max_queue_delay_us, limits.batching.max_queue_size,
        limits.batching.max_queued_bytes);
  }
  // Which decode kernel an int8 KV cache gets: its speed depends on it (docs/PERFORMANCE.md).
  spdlog::info(
      "oneDNN {} ISA {}; int8 KV cache kernel: {}; OpenMP OMP_WAIT_POLICY={} GOMP_SPINCOUNT={}",
      core::OneDnnVersion(), core::OneDnnIsa(),
      core::HasInt8DotKernel() ? "integer dot products (AVX-512 VNNI)"
                               : "fp32 widening (no AVX-512 VNNI)",
      EnvOr("OMP_WAIT_POLICY", "(unset)"), EnvOr("GOMP_SPINCOUNT", "(unset)"));
  spdlog::info(
      "threads: {} core(s) available; {} compute thread(s) shared by all batches and decoding "
      "iterations (a batch under "
      "{} MFLOP uses one); {} batch thread(s) shared by all models; gRPC callback threads handle "
      "I/O and validation",
      AvailableCores(), options.runner.compute_threads, options.runner.parallel_min_mflop,
      options.num_batch_threads);
  const decoding::DecodeRuntimeOptions& decoding = options.decoding;
  spdlog::info(
      "decoding sessions (Decode): KV cache budget {} MiB ({}), {} MiB above the peak mapped "
      "ahead of need, at most {} tokens per iteration, prefill chunks of {} tokens, steps gathered "
      "for up to {} us, idle sessions "
      "closed after {} s (0 = never), at most {} sessions",
      decoding.kv.budget_bytes >> 20, server.kv_cache_budget_source(),
      decoding.kv.prefault_ahead_bytes >> 20, decoding.scheduling.max_iteration_tokens,
      decoding.scheduling.prefill_chunk_tokens, decoding.gather_delay_us,
      decoding.idle_timeout_us / 1000000, decoding.max_sessions);
  if (options.model_poll_interval_ms > 0) {
    spdlog::info("watching the repository every {} ms for model changes",
                 options.model_poll_interval_ms);
  } else {
    spdlog::info("repository polling off: models load once");
  }
}

}  // namespace attnserve::server
