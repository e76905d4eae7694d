// Server: the attnserve gRPC server — the model lifecycle (repository, polling, warm-up), the
// router, the shared batch scheduler and the batch runner, AttentionService, grpc.health.v1.Health
// and server reflection — started, run and drained as one object. The composition root: it
// wires the layers together and owns them.
//
// Thread-safe: port()/Shutdown()/Wait() from any thread; Shutdown() is idempotent.
#ifndef ATTNSERVE_SERVER_APP_SERVER_H_
#define ATTNSERVE_SERVER_APP_SERVER_H_

#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/util/notification.h"
#include "server/app/decode_compute_teams.h"
#include "server/app/decode_metrics_listener.h"
#include "server/app/memory_trimmer.h"
#include "server/app/server_options.h"
#include "server/app/verified_tls_files.h"
#include "server/decoding/decode_runtime.h"
#include "server/http/http_server.h"
#include "server/http/rest_service.h"
#include "server/metrics/metrics_exposer.h"
#include "server/metrics/server_metrics.h"
#include "server/runtime/batch_runner.h"
#include "server/runtime/model_lifecycle.h"
#include "server/runtime/model_router.h"
#include "server/service/attention_service.h"
#include "server/service/inference_service.h"

namespace grpc {
class Server;
}

namespace attnserve::server {

// The name under which health reports the whole server, besides "" (gRPC's convention).
inline constexpr char kServiceHealthName[] = "attnserve.v1.AttentionService";
// The Open Inference Protocol's service, in the health service likewise.
inline constexpr char kInferenceHealthName[] = "inference.GRPCInferenceService";

class Server {
 public:
  // Opens the repository, loads and warms every model up, and starts listening. InvalidArgument
  // for bad options (naming the option) or an unusable repository folder; Unavailable when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);

  // Shuts down with no grace period left (in-flight requests are still answered).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The port the server listens on (the chosen one when the address asked for port 0).
  int port() const { return port_; }
  // The port the REST binding is served on; 0 when it is off.
  int http_port() const { return http_server_ != nullptr ? http_server_->port() : 0; }
  // The port /metrics is served on; 0 when metrics are off.
  int metrics_port() const { return exposer_ != nullptr ? exposer_->port() : 0; }
  // The server's metrics; null when metrics are off.
  metrics::ServerMetrics* metrics() { return metrics_.get(); }
  // The options in force: as given, with compute_threads, num_batch_threads,
  // decoding.kv.budget_bytes and model_limits.request.max_response_bytes resolved.
  const ServerOptions& options() const { return options_; }
  // Where decoding.kv.budget_bytes came from (kv_cache_budget.h), for the startup summary.
  const std::string& kv_cache_budget_source() const { return kv_cache_budget_source_; }
  const ModelRouter& router() const { return router_; }
  const ModelLifecycle& lifecycle() const { return *lifecycle_; }
  AttentionService& service() { return *service_; }
  // The decoding sessions' runtime (attnserve.v1 Decode).
  decoding::DecodeRuntime& decode_runtime() { return *decode_runtime_; }

  // Drains: health goes NOT_SERVING, new requests get UNAVAILABLE, every accepted request is
  // computed and answered, then the server stops. RPCs still open after `grace` (e.g. streams
  // the client never closes) are cancelled.
  void Shutdown(absl::Duration grace);
  // Blocks until Shutdown() has completed.
  void Wait();

 private:
  Server() = default;

  // Logs, metrics and health for what the lifecycle reports.
  ModelLifecycleListener LifecycleListener();
  // Serves REST on options_.http.address (unless empty), over TLS with tls_files_ when set.
  absl::Status StartHttpServer();
  // Serves metrics_ (if any) on options_.metrics_address.
  absl::Status StartMetricsExposer();
  // What attnserve_model_loaded and attnserve_queue_depth report.
  std::vector<metrics::ModelSnapshot> ModelSnapshots() const;

  ServerOptions options_;
  std::string kv_cache_budget_source_;
  // First: everything below may record into it until destroyed.
  std::unique_ptr<metrics::ServerMetrics> metrics_;
  std::unique_ptr<BatchRunner> runner_;
  // Before the lifecycle, whose queues run on it: destroyed after them.
  std::unique_ptr<AttendScheduler> scheduler_;
  ModelRouter router_;
  std::unique_ptr<ModelLifecycle> lifecycle_;
  std::unique_ptr<DecodeMetricsListener> decode_listener_;  // Null when metrics are off.
  std::unique_ptr<DecodeComputeTeams> decode_teams_;        // Over runner_'s compute budget.
  // Before the service, whose Decode streams use it: destroyed after the gRPC server and them.
  std::unique_ptr<decoding::DecodeRuntime> decode_runtime_;
  std::unique_ptr<AttentionService> service_;
  std::unique_ptr<InferenceService> inference_service_;  // Shares service_'s submitter.
  std::unique_ptr<http::RestService> rest_service_;      // Likewise.
  // Before the gRPC server: its certificate provider reads their files until it is destroyed.
  std::unique_ptr<VerifiedTlsFiles> tls_files_;  // Null without TLS.
  std::unique_ptr<grpc::Server> grpc_server_;
  // After the TLS files, whose generation its handshakes read. Null when REST is off.
  std::unique_ptr<http::HttpServer> http_server_;
  std::unique_ptr<MemoryTrimmer> trimmer_;  // Null when malloc_trim_interval_ms is 0.
  // Last: scrapes read the router and the lifecycle, so the exposer stops first.
  std::unique_ptr<metrics::MetricsExposer> exposer_;
  int port_ = 0;
  std::once_flag shutdown_once_;
  Notification shut_down_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_SERVER_H_
