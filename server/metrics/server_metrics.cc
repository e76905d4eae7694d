#include "server/metrics/server_metrics.h"

#include <utility>

#include "absl/status/status.h"
#include "prometheus/metric_family.h"
#include "server/metrics/process_metrics.h"

namespace attnserve::server::metrics {
namespace {

// The `file` labels of attnserve_tls_reload_failures_total.
constexpr std::array<std::string_view, 3> kTlsFiles = {"cert_chain", "private_key", "client_ca"};

std::vector<double> PowersOf(double start, double factor, int count) {
  std::vector<double> bounds;
  bounds.reserve(count);
  for (double bound = start; static_cast<int>(bounds.size()) < count; bound *= factor) {
    bounds.push_back(bound);
  }
  return bounds;
}

prometheus::ClientMetric GaugeSample(const std::string& model, double value) {
  prometheus::ClientMetric metric;
  metric.label = {{.name = "model", .value = model}};
  metric.gauge.value = value;
  return metric;
}

}  // namespace

std::string_view MethodName(Method method) {
  static constexpr std::string_view kNames[kNumMethods] = {
      "Attend",     "AttendStream",  "ListModels", "GetModel",
      "ModelInfer", "ModelMetadata", "Decode",     "RestInfer"};
  return kNames[static_cast<int>(method)];
}

std::string StatusCodeName(grpc::StatusCode code) {
  const int index = static_cast<int>(code);
  // gRPC's codes are absl's, number for number, and absl names them as gRPC does.
  return index >= 0 && index < kNumStatusCodes
             ? absl::StatusCodeToString(static_cast<absl::StatusCode>(index))
             : "UNKNOWN";
}

std::vector<double> LatencyBucketsSeconds() { return PowersOf(50e-6, 2, 19); }
std::vector<double> BatchSequenceBuckets() { return PowersOf(1, 2, 13); }
std::vector<double> BatchTokenBuckets() { return PowersOf(1, 2, 17); }

// attnserve_model_loaded and attnserve_queue_depth, asked of the server at each scrape: they are
// states, not events, and reading them costs the request path nothing.
class ServerMetrics::SnapshotCollectable final : public prometheus::Collectable {
 public:
  void SetSource(std::function<std::vector<ModelSnapshot>()> source) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<ModelSnapshot> models;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (source_) models = source_();
    }
    prometheus::MetricFamily loaded{
        .name = "attnserve_model_loaded",
        .help = "1 while a version of the model is serving, 0 while none is.",
        .type = prometheus::MetricType::Gauge,
        .metric = {}};
    prometheus::MetricFamily depth{.name = "attnserve_queue_depth",
                                   .help = "Requests waiting in the model's batcher for a batch.",
                                   .type = prometheus::MetricType::Gauge,
                                   .metric = {}};
    prometheus::MetricFamily info{
        .name = "attnserve_model_info",
        .help =
            "1 for the version each model serves, labelled with its compute type and what its "
            "decoding sessions' KV cache stores.",
        .type = prometheus::MetricType::Gauge,
        .metric = {}};
    for (const ModelSnapshot& model : models) {
      loaded.metric.push_back(GaugeSample(model.name, model.loaded ? 1 : 0));
      if (!model.loaded) continue;
      depth.metric.push_back(GaugeSample(model.name, model.queue_depth));
      prometheus::ClientMetric& sample = info.metric.emplace_back(GaugeSample(model.name, 1));
      // Sorted by name, as prometheus-cpp orders the labels of the families it builds.
      sample.label = {{.name = "compute_dtype", .value = model.compute_dtype},
                      {.name = "kv_cache_dtype", .value = model.kv_cache_dtype},
                      {.name = "model", .value = model.name},
                      {.name = "version", .value = std::to_string(model.version)}};
    }
    return {std::move(loaded), std::move(depth), std::move(info)};
  }

 private:
  mutable std::mutex mu_;
  std::function<std::vector<ModelSnapshot>()> source_;
};

ModelMetrics::ModelMetrics(ServerMetrics* owner, std::string name)
    : owner_(owner), name_(std::move(name)) {
  // Requests for unknown or no models never reach a batcher: they only count as requests.
  if (name_ == kUnknownModel || name_.empty()) return;
  const prometheus::Labels labels = {{"model", name_}};
  queue_ = &owner->queue_duration_->Add(labels, owner->latency_buckets_);
  compute_ = &owner->compute_duration_->Add(labels, owner->latency_buckets_);
  batch_sequences_ = &owner->batch_sequences_->Add(labels, BatchSequenceBuckets());
  batch_tokens_ = &owner->batch_tokens_->Add(labels, BatchTokenBuckets());
  tokens_ = &owner->tokens_->Add(labels);
  load_failures_ = &owner->load_failures_->Add(labels);
  // A model's successful Attend, AttendStream and ModelInfer series exist from its load on, at
  // zero, so that rate() and histogram_quantile() see their first requests (a series born at 1 has
  // no increase).
  for (Method method : {Method::kAttend, Method::kAttendStream, Method::kModelInfer}) {
    RequestCounter(method, grpc::StatusCode::OK);
    DurationHistogram(method);
  }
}

prometheus::Counter& ModelMetrics::RequestCounter(Method method, grpc::StatusCode code) {
  const int m = static_cast<int>(method);
  int c = static_cast<int>(code);
  if (c < 0 || c >= kNumStatusCodes) c = static_cast<int>(grpc::StatusCode::UNKNOWN);
  prometheus::Counter* counter = requests_[m][c].load(std::memory_order_acquire);
  if (counter == nullptr) {
    counter = &owner_->requests_->Add({{"model", name_},
                                       {"method", std::string(MethodName(method))},
                                       {"code", StatusCodeName(static_cast<grpc::StatusCode>(c))}});
    requests_[m][c].store(counter, std::memory_order_release);
  }
  return *counter;
}

prometheus::Histogram& ModelMetrics::DurationHistogram(Method method) {
  const int m = static_cast<int>(method);
  prometheus::Histogram* duration = durations_[m].load(std::memory_order_acquire);
  if (duration == nullptr) {
    duration = &owner_->request_duration_->Add(
        {{"model", name_}, {"method", std::string(MethodName(method))}}, owner_->latency_buckets_);
    durations_[m].store(duration, std::memory_order_release);
  }
  return *duration;
}

void ModelMetrics::RecordRequest(Method method, grpc::StatusCode code, double seconds) {
  RequestCounter(method, code).Increment();
  DurationHistogram(method).Observe(seconds);
}

void ModelMetrics::RecordBatch(int64_t sequences, int64_t tokens, double compute_seconds) {
  batch_sequences_->Observe(static_cast<double>(sequences));
  batch_tokens_->Observe(static_cast<double>(tokens));
  compute_->Observe(compute_seconds);
  tokens_->Increment(static_cast<double>(tokens));
}

ServerMetrics::ServerMetrics(const BuildInfo& build)
    : registry_(std::make_shared<prometheus::Registry>()),
      snapshots_(std::make_shared<SnapshotCollectable>()),
      process_(MakeProcessCollectable()),
      latency_buckets_(LatencyBucketsSeconds()) {
  using prometheus::BuildCounter, prometheus::BuildGauge, prometheus::BuildHistogram;
  requests_ = &BuildCounter()
                   .Name("attnserve_requests_total")
                   .Help(
                       "Requests answered, by model, RPC method and final gRPC status code. "
                       "AttendStream counts each message.")
                   .Register(*registry_);
  request_duration_ = &BuildHistogram()
                           .Name("attnserve_request_duration_seconds")
                           .Help("Time from a request's arrival to its answer, server side.")
                           .Register(*registry_);
  queue_duration_ = &BuildHistogram()
                         .Name("attnserve_queue_duration_seconds")
                         .Help(
                             "Time a request waited in its model's batcher before its batch "
                             "started.")
                         .Register(*registry_);
  compute_duration_ = &BuildHistogram()
                           .Name("attnserve_compute_duration_seconds")
                           .Help("Time one batch's forward pass took.")
                           .Register(*registry_);
  batch_sequences_ = &BuildHistogram()
                          .Name("attnserve_batch_sequences")
                          .Help("Sequences per executed batch.")
                          .Register(*registry_);
  batch_tokens_ = &BuildHistogram()
                       .Name("attnserve_batch_tokens")
                       .Help("Query tokens (rows) per executed batch.")
                       .Register(*registry_);
  tokens_ = &BuildCounter()
                 .Name("attnserve_tokens_total")
                 .Help("Query tokens computed in executed batches.")
                 .Register(*registry_);
  load_failures_ = &BuildCounter()
                        .Name("attnserve_model_load_failures_total")
                        .Help("Failed loads or reloads of the model's folder.")
                        .Register(*registry_);
  repository_scan_failures_ =
      &BuildCounter()
           .Name("attnserve_repository_scan_failures_total")
           .Help(
               "Times the model repository folder became impossible to list (replaced by a file, "
               "a symlink loop, no permission); the models loaded before keep serving.")
           .Register(*registry_)
           .Add({});
  prometheus::Family<prometheus::Counter>& tls_failures =
      BuildCounter()
          .Name("attnserve_tls_reload_failures_total")
          .Help(
              "Times a changed TLS file (cert_chain, private_key, client_ca) was refused: empty, "
              "half-written, unreadable, not PEM, or a key that does not match the certificate; "
              "the last good set keeps serving.")
          .Register(*registry_);
  for (size_t i = 0; i < kTlsFiles.size(); ++i) {
    tls_reload_failures_[i] = &tls_failures.Add({{"file", std::string(kTlsFiles[i])}});
  }
  inflight_ = &BuildGauge()
                   .Name("attnserve_inflight_requests")
                   .Help(
                       "Requests (unary calls and stream messages) received and not yet "
                       "answered.")
                   .Register(*registry_)
                   .Add({});
  decode_ = std::make_unique<DecodeMetrics>(*registry_);
  BuildGauge()
      .Name("attnserve_build_info")
      .Help(
          "Always 1; the labels describe the build, the machine's oneDNN ISA and whether it "
          "computes bf16 natively (bf16 models load only then, unless emulation is allowed).")
      .Register(*registry_)
      .Add({{"version", build.version},
            {"revision", build.revision},
            {"onednn_version", build.onednn_version},
            {"isa", build.isa},
            {"native_bf16", build.native_bf16 ? "true" : "false"}})
      .Set(1);
  unknown_ = std::unique_ptr<ModelMetrics>(new ModelMetrics(this, kUnknownModel));
  no_model_ = std::unique_ptr<ModelMetrics>(new ModelMetrics(this, ""));
}

ServerMetrics::~ServerMetrics() = default;

ModelMetrics& ServerMetrics::AddModel(const std::string& name) {
  // Neither is a model folder's name: they have no per-model series to register.
  if (name.empty()) return *no_model_;
  if (name == kUnknownModel) return *unknown_;
  std::lock_guard<std::shared_mutex> lock(mu_);
  std::unique_ptr<ModelMetrics>& entry = models_[name];
  if (entry == nullptr) entry = std::unique_ptr<ModelMetrics>(new ModelMetrics(this, name));
  return *entry;
}

ModelMetrics& ServerMetrics::ForModel(std::string_view name) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = models_.find(name);
  return it != models_.end() ? *it->second : *unknown_;
}

void ServerMetrics::CountTlsReloadFailure(std::string_view file) {
  for (size_t i = 0; i < kTlsFiles.size(); ++i) {
    if (kTlsFiles[i] == file) tls_reload_failures_[i]->Increment();
  }
}

void ServerMetrics::CountLoadFailure(const std::string& name) {
  ModelMetrics& model = AddModel(name);
  if (model.load_failures_ != nullptr) model.load_failures_->Increment();
}

void ServerMetrics::SetSnapshotSource(std::function<std::vector<ModelSnapshot>()> source) {
  snapshots_->SetSource(std::move(source));
}

std::vector<std::shared_ptr<prometheus::Collectable>> ServerMetrics::Collectables() const {
  return {registry_, snapshots_, decode_->Gauges(), process_};
}

}  // namespace attnserve::server::metrics
