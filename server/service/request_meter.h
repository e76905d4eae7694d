// RequestMeter: one request's entry in the metrics, from its arrival (when it is created) to its
// answer (Record, called once). It counts the request in attnserve_inflight_requests meanwhile,
// and on Record adds it to attnserve_requests_total and attnserve_request_duration_seconds of its
// model label. Without metrics (a null ServerMetrics) it does nothing.
//
// A small value type: copied into the callbacks that answer the request. Not thread-safe; Record
// it from whichever thread answers.
#ifndef ATTNSERVE_SERVER_SERVICE_REQUEST_METER_H_
#define ATTNSERVE_SERVER_SERVICE_REQUEST_METER_H_

#include <grpcpp/support/status.h>

#include <chrono>

#include "server/metrics/server_metrics.h"

namespace attnserve::server {

class RequestMeter {
 public:
  RequestMeter() = default;  // Inert.
  // `metrics` may be null; otherwise `model` is the request's model label (never null).
  RequestMeter(metrics::ServerMetrics* metrics, metrics::ModelMetrics* model,
               metrics::Method method)
      : metrics_(metrics), model_(model), method_(method) {
    if (metrics_ == nullptr) return;
    start_ = std::chrono::steady_clock::now();
    metrics_->RequestStarted();
  }

  void Record(grpc::StatusCode code) {
    if (metrics_ == nullptr) return;
    model_->RecordRequest(method_, code, metrics::SecondsSince(start_));
    metrics_->RequestEnded();
    metrics_ = nullptr;  // Once.
  }

 private:
  metrics::ServerMetrics* metrics_ = nullptr;
  metrics::ModelMetrics* model_ = nullptr;
  metrics::Method method_ = metrics::Method::kAttend;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_REQUEST_METER_H_
