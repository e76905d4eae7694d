// ServerMetrics: every attnserve_* Prometheus metric of the server, built once.
//
// The families are created in the constructor. A model's labelled children are created when the
// model is first registered (AddModel) and cached in its ModelMetrics, so the request path does a
// pointer lookup and an increment. The `model` label only takes registered names (the
// repository's folders, a bounded set) plus kUnknownModel, under which requests naming any other
// model are counted: a client cannot grow the series count.
//
// Per-request children of attnserve_requests_total (one per method and status code) are created
// on first use, so the exposition shows only codes that happened; afterwards they are cached too.
// The exception: each model's OK series of Attend and AttendStream exist from its registration,
// at zero, so that rate() sees the first requests.
//
// Thread-safe. ModelMetrics references stay valid as long as the ServerMetrics (models are never
// unregistered: an unloaded model's counters keep their totals, and its model_loaded gauge says 0).
#ifndef ATTNSERVE_SERVER_METRICS_SERVER_METRICS_H_
#define ATTNSERVE_SERVER_METRICS_SERVER_METRICS_H_

#include <grpcpp/support/status.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/metrics/decode_metrics.h"

namespace attnserve::server::metrics {

// The `model` label of requests naming a model the server does not know.
inline constexpr char kUnknownModel[] = "<unknown>";

// The RPC methods counted in attnserve_requests_total{method}.
// kModelInfer and kModelMetadata: the Open Inference Protocol's inference and metadata calls
// (inference.GRPCInferenceService), labelled apart from attnserve.v1's. The streams count one
// request per message: kAttendStream with its in-band code, kDecode (decoding sessions) with its
// first failed item's code (OK when every item succeeded).
enum class Method {
  kAttend = 0,
  kAttendStream,
  kListModels,
  kGetModel,
  kModelInfer,
  kModelMetadata,
  kDecode,
  kRestInfer  // The Open Inference Protocol's REST infer (POST /v2/models/{name}/infer).
};
inline constexpr int kNumMethods = 8;
std::string_view MethodName(Method method);
// gRPC's name of `code` ("OK", "INVALID_ARGUMENT", ...).
std::string StatusCodeName(grpc::StatusCode code);
inline constexpr int kNumStatusCodes = 17;

// Bucket upper bounds, in seconds for latencies: 50 us * 2^k for k = 0..18, i.e. 50 us to 13.1 s,
// the same for every model and method, so histograms aggregate across models and replicas.
std::vector<double> LatencyBucketsSeconds();
// Batch sizes: powers of two from 1 to 4096 sequences, and from 1 to 65536 tokens.
std::vector<double> BatchSequenceBuckets();
std::vector<double> BatchTokenBuckets();

// The build attnserve_build_info{version,revision,onednn_version,isa,native_bf16} describes.
struct BuildInfo {
  std::string version = {};   // The release, e.g. "1.0.0".
  std::string revision = {};  // The git revision built from, e.g. "0123456789ab" or "...+dirty".
  std::string onednn_version = {};
  std::string isa = {};
  bool native_bf16 = false;  // Whether bf16 compute_dtype runs natively (not emulated).
};

// What the server reports about one model when scraped (attnserve_model_loaded,
// attnserve_queue_depth, attnserve_model_info).
struct ModelSnapshot {
  std::string name;
  bool loaded = false;      // A version is serving.
  int64_t queue_depth = 0;  // Requests waiting in its batcher.
  // The serving version, its compute type ("fp32", "bf16") and what its KV cache stores ("fp32",
  // "bf16", "int8"); read only when loaded.
  int64_t version = 0;
  std::string compute_dtype;
  std::string kv_cache_dtype;
};

class ServerMetrics;

// The cached children of one model label. Thread-safe.
class ModelMetrics {
 public:
  ModelMetrics(const ModelMetrics&) = delete;
  ModelMetrics& operator=(const ModelMetrics&) = delete;

  const std::string& name() const { return name_; }
  // One finished request: attnserve_requests_total and attnserve_request_duration_seconds.
  void RecordRequest(Method method, grpc::StatusCode code, double seconds);
  // One request taken from the queue into a batch.
  void RecordQueueTime(double seconds) { queue_->Observe(seconds); }
  // One executed batch (a forward pass): its size, compute time and tokens.
  void RecordBatch(int64_t sequences, int64_t tokens, double compute_seconds);

 private:
  friend class ServerMetrics;
  ModelMetrics(ServerMetrics* owner, std::string name);
  // The cached child, created on first use.
  prometheus::Counter& RequestCounter(Method method, grpc::StatusCode code);
  prometheus::Histogram& DurationHistogram(Method method);

  ServerMetrics* const owner_;
  const std::string name_;
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Histogram* compute_ = nullptr;
  prometheus::Histogram* batch_sequences_ = nullptr;
  prometheus::Histogram* batch_tokens_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
  prometheus::Counter* load_failures_ = nullptr;
  // Created on first use: the families return the same child for the same labels, so two
  // threads racing to create one store the same pointer.
  std::array<std::atomic<prometheus::Histogram*>, kNumMethods> durations_{};
  std::array<std::array<std::atomic<prometheus::Counter*>, kNumStatusCodes>, kNumMethods>
      requests_{};
};

class ServerMetrics {
 public:
  explicit ServerMetrics(const BuildInfo& build);
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Registers `name` as a model label (idempotent) and returns its children. "" and
  // kUnknownModel are not model names: they get no_model() and unknown_model().
  ModelMetrics& AddModel(const std::string& name);
  // The children of a registered model; kUnknownModel's for any other name.
  ModelMetrics& ForModel(std::string_view name);
  ModelMetrics& unknown_model() { return *unknown_; }
  // The label of requests about no model in particular (ListModels): model="".
  ModelMetrics& no_model() { return *no_model_; }

  // attnserve_model_load_failures_total{model}: registers the model if needed ("" and
  // kUnknownModel count nothing).
  void CountLoadFailure(const std::string& name);
  // attnserve_repository_scan_failures_total: the repository folder became unreadable.
  void CountRepositoryScanFailure() { repository_scan_failures_->Increment(); }
  // attnserve_tls_reload_failures_total{file}: a changed TLS file (`file` is "cert_chain",
  // "private_key" or "client_ca") was refused and the last good set kept serving.
  void CountTlsReloadFailure(std::string_view file);
  // attnserve_inflight_requests: +1 when a request arrives, -1 when it is answered.
  void RequestStarted() { inflight_->Increment(); }
  void RequestEnded() { inflight_->Decrement(); }

  // Where attnserve_model_loaded and attnserve_queue_depth are read at scrape time. Set once,
  // before the metrics are exposed; the source must stay callable while they are.
  void SetSnapshotSource(std::function<std::vector<ModelSnapshot>()> source);

  // The decoding sessions' metrics (decode_metrics.h).
  DecodeMetrics& decode() { return *decode_; }

  // What the exposer serves: the registry, the scrape-time gauges, the process metrics.
  std::vector<std::shared_ptr<prometheus::Collectable>> Collectables() const;

 private:
  friend class ModelMetrics;
  class SnapshotCollectable;

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* request_duration_;
  prometheus::Family<prometheus::Histogram>* queue_duration_;
  prometheus::Family<prometheus::Histogram>* compute_duration_;
  prometheus::Family<prometheus::Histogram>* batch_sequences_;
  prometheus::Family<prometheus::Histogram>* batch_tokens_;
  prometheus::Family<prometheus::Counter>* tokens_;
  prometheus::Family<prometheus::Counter>* load_failures_;
  prometheus::Counter* repository_scan_failures_;
  std::array<prometheus::Counter*, 3> tls_reload_failures_{};  // cert_chain, private_key, client_ca
  prometheus::Gauge* inflight_;
  std::shared_ptr<SnapshotCollectable> snapshots_;
  std::shared_ptr<prometheus::Collectable> process_;
  const std::vector<double> latency_buckets_;
  std::unique_ptr<DecodeMetrics> decode_;

  std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<ModelMetrics>, std::less<>> models_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ModelMetrics> unknown_;
  std::unique_ptr<ModelMetrics> no_model_;
};

// Seconds since `start` on the steady clock.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace attnserve::server::metrics

#endif  // ATTNSERVE_SERVER_METRICS_SERVER_METRICS_H_
