#include "server/app/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attnserve/version.h"
#include "core/forward/onednn_support.h"
#include "server/app/accept_guard.h"
#include "server/app/kv_cache_budget.h"
#include "server/app/memory_trimmer.h"
#include "server/app/tls_credentials.h"
#include "server/batching/batching_options.h"
#include "server/runtime/compute_budget.h"
#include "server/runtime/memory_limit.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

// How long a draining server keeps its connections open after the last call is answered. On a
// busy machine the final answers can take milliseconds to reach the client's socket.
constexpr std::chrono::milliseconds kCloseLinger{50};
// How long GOAWAY has to go out before the drain answers the refusals it held.
constexpr std::chrono::milliseconds kGoawayLead{50};

absl::Status ValidateOptions(const ServerOptions& options) {
  if (absl::Status status = ValidateTlsOptions(options.tls); !status.ok()) return status;
  if (!options.http.address.empty()) {
    if (absl::Status status = http::ValidateHttpServerOptions(options.http); !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = ValidateModelLimits(options.model_limits); !status.ok()) {
    return status;
  }
  if (options.max_message_bytes < 1024 || options.max_message_bytes > (int64_t{2} << 30) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes: expected 1024..2147483647, got ", options.max_message_bytes));
  }
  if (options.runner.compute_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compute_threads: expected >= 0 (0 = one per core), got ", options.runner.compute_threads));
  }
  if (options.model_poll_interval_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_poll_interval_ms: expected >= 0 (0 = off), got ", options.model_poll_interval_ms));
  }
  if (options.max_stream_unsent_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_stream_unsent_bytes: expected >= 1, got ",
                                                   options.max_stream_unsent_bytes));
  }
  if (options.max_streams_unsent_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_streams_unsent_bytes: expected >= 1, got ",
                                                   options.max_streams_unsent_bytes));
  }
  if (options.malloc_trim_interval_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("malloc_trim_interval_ms: expected >= 0 (0 = never), got ",
                     options.malloc_trim_interval_ms));
  }
  if (absl::Status status = decoding::ValidateDecodeRuntimeOptions(options.decoding);
      !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("decoding.", status.message()));
  }
  if (options.grpc_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpc_memory_bytes: expected >= 0 (0 = no quota), got ", options.grpc_memory_bytes));
  }
  if (options.grpc_stream_window_bytes < (int64_t{64} << 10) ||
      options.grpc_stream_window_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpc_stream_window_bytes: expected 65536..1073741824, got ",
                     options.grpc_stream_window_bytes));
  }
  if (options.max_queued_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_queued_bytes: expected >= 0 (0 = no limit), got ", options.max_queued_bytes));
  }
  // gRPC takes both as int milliseconds.
  constexpr int64_t kMaxAgeMs = 2147483647;
  if (options.handshake_timeout_ms < 1 || options.handshake_timeout_ms > kMaxAgeMs) {
    return absl::InvalidArgumentError(absl::StrCat("handshake_timeout_ms: expected 1..", kMaxAgeMs,
                                                   ", got ", options.handshake_timeout_ms));
  }
  if (options.max_connection_age_ms < 0 || options.max_connection_age_ms > kMaxAgeMs) {
    return absl::InvalidArgumentError(absl::StrCat("max_connection_age_ms: expected 0..", kMaxAgeMs,
                                                   " (0 = unlimited), got ",
                                                   options.max_connection_age_ms));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"max_connection_idle_ms", options.max_connection_idle_ms},
        {"keepalive_time_ms", options.keepalive_time_ms},
        {"keepalive_timeout_ms", options.keepalive_timeout_ms}}) {
    if (value < 0 || value > kMaxAgeMs) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected 0..", kMaxAgeMs, ", got ", value));
    }
  }
  if (options.keepalive_time_ms < 1000 || options.keepalive_timeout_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keepalive_time_ms: expected >= 1000 and keepalive_timeout_ms >= 1, got ",
                     options.keepalive_time_ms, " and ", options.keepalive_timeout_ms));
  }
  if (options.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_concurrent_streams: expected >= 1, got ",
                                                   options.max_concurrent_streams));
  }
  if (options.max_connection_age_grace_ms < 0 || options.max_connection_age_grace_ms > kMaxAgeMs) {
    return absl::InvalidArgumentError(absl::StrCat("max_connection_age_grace_ms: expected 0..",
                                                   kMaxAgeMs, ", got ",
                                                   options.max_connection_age_grace_ms));
  }
  return absl::OkStatus();
}

void LogModelEvents(const std::vector<repository::ModelEvent>& events) {
  for (const repository::ModelEvent& event : events) {
    if (event.kind == repository::ModelEvent::Kind::kFailed) {
      spdlog::error("model {}: load failed, version {} keeps serving: {}", event.name,
                    event.version, event.status.ToString());
    } else {
      spdlog::info("model {}: {} (serving version {})", event.name,
                   repository::EventKindName(event.kind), event.version);
    }
  }
}

void CountModelEvents(const std::vector<repository::ModelEvent>& events,
                      metrics::ServerMetrics* metrics) {
  if (metrics == nullptr) return;
  for (const repository::ModelEvent& event : events) {
    if (event.kind == repository::ModelEvent::Kind::kFailed) {
      metrics->CountLoadFailure(event.name);
    } else {
      metrics->AddModel(event.name);
    }
  }
}

// Every model the repository knows at start gets its labels; failed loads are counted.
void RegisterModels(const std::vector<repository::ModelState>& states,
                    metrics::ServerMetrics* metrics) {
  if (metrics == nullptr) return;
  for (const repository::ModelState& state : states) {
    metrics->AddModel(state.name);
    if (!state.last_error.ok()) metrics->CountLoadFailure(state.name);
  }
}

// What each executed batch adds to the metrics (nothing without metrics).
BatchRunner::BatchListener BatchMetricsListener(metrics::ServerMetrics* metrics) {
  if (metrics == nullptr) return nullptr;
  return [metrics](const BatchReport& report) {
    metrics::ModelMetrics& model = metrics->ForModel(report.model);
    model.RecordBatch(report.sequences, report.tokens, report.compute_us * 1e-6);
    for (int64_t queue_us : report.queue_us) model.RecordQueueTime(queue_us * 1e-6);
  };
}

std::unique_ptr<metrics::ServerMetrics> MakeMetrics(const ServerOptions& options) {
  if (options.metrics_address.empty()) return nullptr;
  return std::make_unique<metrics::ServerMetrics>(metrics::BuildInfo{
      .version = kVersion,
      .revision = options.git_revision,
      .onednn_version = core::OneDnnVersion(),
      .isa = core::OneDnnIsa(),
      .native_bf16 = core::HasNativeBf16(),
  });
}

}  // namespace

ModelLifecycleListener Server::LifecycleListener() {
  return {.on_events =
              [metrics = metrics_.get(), root = options_.repository.root](
                  const std::vector<repository::ModelEvent>& events, const absl::Status& scan) {
                LogModelEvents(events);
                CountModelEvents(events, metrics);
                // Called when the scan status changes: once per episode, not once per poll.
                if (!scan.ok()) {
                  spdlog::error(
                      "model repository {}: cannot be scanned, every model keeps "
                      "serving: {}",
                      root.string(), scan.ToString());
                  if (metrics != nullptr) metrics->CountRepositoryScanFailure();
                } else if (events.empty()) {
                  spdlog::info("model repository {}: readable again", root.string());
                }
              },
          .on_serving_changed =
              [this](const std::string& name, bool serving) {
                if (metrics_ != nullptr) metrics_->AddModel(name);
                // Null during Start's first sync: health is set once the server listens.
                if (grpc_server_ != nullptr) {
                  grpc_server_->GetHealthCheckService()->SetServingStatus(name, serving);
                }
              }};
}

absl::Status Server::StartHttpServer() {
  if (options_.http.address.empty()) return absl::OkStatus();
  rest_service_ = std::make_unique<http::RestService>(
      &service_->submitter(), &service_->open_calls(),
      InferenceServerIdentity{.name = "attnserve", .version = kVersion});
  std::optional<http::HttpsFiles> https;
  if (tls_files_ != nullptr) {
    https =
        http::HttpsFiles{.cert_chain_path = tls_files_->cert_chain_path(),
                         .private_key_path = tls_files_->private_key_path(),
                         .client_ca_path = tls_files_->client_ca_path(),
                         .generation = [files = tls_files_.get()] { return files->generation(); }};
  }
  absl::StatusOr<std::unique_ptr<http::HttpServer>> server =
      http::HttpServer::Start(options_.http, rest_service_.get(), https ? &*https : nullptr);
  if (!server.ok()) return server.status();
  http_server_ = *std::move(server);
  return absl::OkStatus();
}

absl::Status Server::StartMetricsExposer() {
  if (metrics_ == nullptr) return absl::OkStatus();
  metrics_->SetSnapshotSource([this] { return ModelSnapshots(); });
  absl::StatusOr<std::unique_ptr<metrics::MetricsExposer>> exposer =
      metrics::MetricsExposer::Start(options_.metrics_address, *metrics_);
  if (!exposer.ok()) return exposer.status();
  exposer_ = *std::move(exposer);
  return absl::OkStatus();
}

std::vector<metrics::ModelSnapshot> Server::ModelSnapshots() const {
  const std::map<std::string, int64_t> depths = router_.QueueDepths();
  std::vector<metrics::ModelSnapshot> snapshots;
  for (const repository::ModelState& state : lifecycle_->States()) {
    auto depth = depths.find(state.name);
    const model::Model* serving = state.serving.get();
    snapshots.push_back(
        {.name = state.name,
         .loaded = serving != nullptr,
         .queue_depth = depth != depths.end() ? depth->second : 0,
         .version = serving != nullptr ? serving->version : 0,
         .compute_dtype = serving != nullptr ? std::string(core::ComputeTypeName(
                                                   serving->layer->config().compute_type))
                                             : std::string(),
         .kv_cache_dtype = serving != nullptr
                               ? std::string(model::KvCacheStorageName(serving->config))
                               : std::string()});
  }
  return snapshots;
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& requested) {
  if (requested.num_batch_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_batch_threads: expected >= 0 (0 = one per compute thread), got ",
                     requested.num_batch_threads));
  }
  ServerOptions options = requested;
  if (options.runner.compute_threads == 0) options.runner.compute_threads = AvailableCores();
  // One batch thread per compute thread, so that under load every compute thread has a batch.
  if (options.num_batch_threads == 0) options.num_batch_threads = options.runner.compute_threads;
  if (options.decoding.compute_threads == 0) {
    options.decoding.compute_threads = options.runner.compute_threads;
  }
  const KvCacheBudget kv_budget =
      ResolveKvCacheBudget(options.decoding.kv.budget_bytes, AvailableMemory());
  options.decoding.kv.budget_bytes = kv_budget.bytes;
  options.model_limits.request.max_response_bytes = options.max_message_bytes;
  options.http.max_body_bytes = options.max_message_bytes;
  if (absl::Status status = ValidateOptions(options); !status.ok()) return status;
  std::unique_ptr<Server> server(new Server());
  server->options_ = options;
  server->kv_cache_budget_source_ = kv_budget.source;

  absl::StatusOr<std::unique_ptr<repository::ModelRepository>> repository =
      repository::ModelRepository::Open(options.repository);
  if (!repository.ok()) return repository.status();
  for (const repository::ModelState& state : (*repository)->States()) {
    if (!state.last_error.ok()) {
      spdlog::error("model {}: not loaded: {}", state.name, state.last_error.ToString());
    }
  }

  server->metrics_ = MakeMetrics(options);
  RegisterModels((*repository)->States(), server->metrics_.get());
  server->runner_ = std::make_unique<BatchRunner>(options.runner, batching::RealClock::Default(),
                                                  BatchMetricsListener(server->metrics_.get()));
  server->scheduler_ = std::make_unique<AttendScheduler>(
      batching::SharedBatchSchedulerOptions{.num_batch_threads = options.num_batch_threads,
                                            .max_queued_bytes = options.max_queued_bytes});
  server->lifecycle_ = std::make_unique<ModelLifecycle>(
      *std::move(repository), server->scheduler_.get(), server->runner_.get(), &server->router_,
      ModelLifecycleOptions{.default_limits = options.model_limits,
                            .default_model = options.default_model,
                            .poll_interval_ms = options.model_poll_interval_ms},
      server->LifecycleListener());
  server->service_ = std::make_unique<AttentionService>(
      &server->router_, batching::RealClock::Default(), server->metrics_.get(),
      options.max_stream_unsent_bytes, options.max_streams_unsent_bytes);
  // Decoding sessions: one loop thread; its metrics through the listener, its states at scrape.
  if (server->metrics_ != nullptr) {
    server->decode_listener_ = std::make_unique<DecodeMetricsListener>(&server->metrics_->decode());
  }
  // Its passes take their threads from the batches' compute budget: together never more.
  server->decode_teams_ = std::make_unique<DecodeComputeTeams>(&server->runner_->compute_budget());
  absl::StatusOr<std::unique_ptr<decoding::DecodeRuntime>> decode_runtime =
      decoding::DecodeRuntime::Create(options.decoding, batching::RealClock::Default(),
                                      server->decode_listener_.get(), server->decode_teams_.get());
  if (!decode_runtime.ok()) return decode_runtime.status();
  server->decode_runtime_ = *std::move(decode_runtime);
  server->service_->EnableDecoding(server->decode_runtime_.get());
  if (server->metrics_ != nullptr) {
    server->metrics_->decode().SetSnapshotSource([runtime = server->decode_runtime_.get()] {
      const decoding::DecodeStats stats = runtime->Stats();
      return metrics::DecodeSnapshot{.kv_bytes_used = stats.kv_bytes_used,
                                     .kv_bytes_capacity = stats.kv_bytes_capacity,
                                     .kv_bytes_touched = stats.kv_bytes_touched,
                                     .sessions_open = stats.sessions_open};
    });
  }
  // The Open Inference Protocol on the same port, through the same submitter and drain.
  server->inference_service_ = std::make_unique<InferenceService>(
      &server->service_->submitter(), &server->service_->open_calls(),
      InferenceServerIdentity{.name = "attnserve", .version = kVersion});

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Before the listener exists: one moment at the open-file limit must not close it for good.
  if (absl::Status guard = ArmAcceptGuard(); !guard.ok()) {
    spdlog::warn("{}; a moment at the open-file limit may stop the server accepting connections",
                 guard.ToString());
  }
  if (TlsEnabled(options.tls)) {
    VerifiedTlsFiles::FailureCounter count_failure;
    if (server->metrics_ != nullptr) {
      count_failure = [metrics = server->metrics_.get()](TlsFile file) {
        metrics->CountTlsReloadFailure(TlsFileLabel(file));
      };
    }
    absl::StatusOr<std::unique_ptr<VerifiedTlsFiles>> files =
        VerifiedTlsFiles::Start(options.tls, std::move(count_failure));
    if (!files.ok()) return files.status();
    server->tls_files_ = *std::move(files);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.grpc_address, MakeServerCredentials(server->tls_files_.get()),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->inference_service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // Connections that cannot be abused: idle ones close, silent ones are pinged (and clients may
  // ping no more often than once a minute while idle), streams per connection are capped.
  if (options.max_connection_idle_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(options.max_connection_idle_ms));
  }
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(options.keepalive_time_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(options.keepalive_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(options.handshake_timeout_ms));
  // Each stream buffers at most its window of a client's uploads while it does not read
  // (server_options.h says why the window is fixed).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             static_cast<int>(options.grpc_stream_window_bytes));
  // Constructed here, the quota is shared with the server's channel args and freed with it.
  if (options.grpc_memory_bytes > 0) {
    grpc::ResourceQuota quota("attnserve");
    quota.Resize(static_cast<size_t>(options.grpc_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  if (options.max_connection_age_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(options.max_connection_age_ms));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               static_cast<int>(options.max_connection_age_grace_ms));
  }
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("grpc_address: cannot listen on \"",
                                               options.grpc_address,
                                               "\" (in use, or not a host:port this machine has)"));
  }

  if (absl::Status status = server->StartHttpServer(); !status.ok()) return status;

  if (options.malloc_trim_interval_ms > 0) {
    server->trimmer_ =
        std::make_unique<MemoryTrimmer>(absl::Milliseconds(options.malloc_trim_interval_ms));
  }

  // Scrapes read the router: expose only now that everything exists.
  if (absl::Status status = server->StartMetricsExposer(); !status.ok()) return status;

  grpc::HealthCheckServiceInterface* health = server->grpc_server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceHealthName, true);
  health->SetServingStatus(kInferenceHealthName, true);
  for (const ModelRoute& route : server->router_.Routes()) {
    health->SetServingStatus(route.model->name, true);
  }
  server->lifecycle_->StartPolling();
  return server;
}

Server::~Server() {
  Shutdown(absl::ZeroDuration());
  // Members go in reverse order: the gRPC server (now idle), the service, the lifecycle (drained),
  // the runner.
}

void Server::Shutdown(absl::Duration grace) {
  std::call_once(shutdown_once_, [this, grace] {
    if (grpc_server_ == nullptr) {
      shut_down_.Notify();
      return;
    }
    const auto deadline = std::chrono::system_clock::now() + absl::ToChronoMicroseconds(grace);
    const auto steady_deadline =
        std::chrono::steady_clock::now() + absl::ToChronoMicroseconds(grace);
    grpc_server_->GetHealthCheckService()->Shutdown();  // Everything NOT_SERVING, for good.
    // New calls: UNAVAILABLE, held until GOAWAY is out (drain_gate.h); idle streams finish.
    service_->BeginDrain();
    // Stops polling, then computes every accepted request at once, without waiting out
    // max_queue_delay_us, and answers it; afterwards the queues refuse work.
    // The decoding runtime likewise answers every accepted step, then closes its sessions (the
    // Decode streams, told to stop reading above, finish UNAVAILABLE once answered).
    std::thread drainer([this] {
      lifecycle_->DrainAll();
      decode_runtime_->Drain();
    });
    // Once every accepted call is answered, the connections stay open a little longer so that
    // clients read their last answers before gRPC closes them (open_calls.h tells why).
    if (service_->open_calls().WaitUntilOnlyHeld(steady_deadline)) {
      std::this_thread::sleep_until(
          std::min(steady_deadline, std::chrono::steady_clock::now() + kCloseLinger));
    } else {
      // Out of time: gRPC cancels what is still open, but the held refusals are answered first.
      service_->ReleaseRefusals();
    }
    // gRPC's Shutdown sends GOAWAY at once and closes the listener, then waits for every call
    // (the held refusals too) until the deadline, and cancels whatever is still open then:
    // streams whose client keeps them open, and requests the drain has not reached yet, which
    // the batchers then drop instead of computing. So shutdown takes at most the grace period
    // plus the batches already computing.
    std::thread stopper([this, deadline] { grpc_server_->Shutdown(deadline); });
    // With GOAWAY out ahead of them on each connection, the held refusals are answered: a
    // client's next call goes to a new connection (another replica) instead of racing the
    // shutdown on this one, where gRPC would cancel it.
    std::this_thread::sleep_until(
        std::min(steady_deadline, std::chrono::steady_clock::now() + kGoawayLead));
    service_->ReleaseRefusals();
    stopper.join();
    drainer.join();
    // Every accepted REST request is answered by now (the drain computed it); this closes the
    // port and joins the workers once their current requests are written.
    if (http_server_ != nullptr) http_server_->Stop();
    shut_down_.Notify();
  });
}

void Server::Wait() { shut_down_.WaitForNotification(); }

}  // namespace attnserve::server
