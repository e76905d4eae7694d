// MetricsExposer: serves ServerMetrics over HTTP at /metrics in Prometheus' text format
// (prometheus-cpp's pull exposer, an embedded CivetWeb server with its own threads: four, and a
// 1 s read/write timeout, so that clients that send half a request or never read cannot hold the
// endpoint: a scrape waits at most about a second behind them).
//
// Thread-safe; the metrics must outlive the exposer.
#ifndef ATTNSERVE_SERVER_METRICS_METRICS_EXPOSER_H_
#define ATTNSERVE_SERVER_METRICS_METRICS_EXPOSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/metrics/server_metrics.h"

namespace prometheus {
class Exposer;
}

namespace attnserve::server::metrics {

class MetricsExposer {
 public:
  // Listens on `address` (host:port; port 0 picks a free one). InvalidArgument naming
  // metrics_address for an address that is not host:port, Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(const std::string& address,
                                                               const ServerMetrics& metrics);
  ~MetricsExposer();
  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;

  // The port bound (the chosen one when the address asked for port 0).
  int port() const { return port_; }

 private:
  MetricsExposer() = default;

  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string wake_host_;  // Where the destructor connects to stop the listener promptly.
};

}  // namespace attnserve::server::metrics

#endif  // ATTNSERVE_SERVER_METRICS_METRICS_EXPOSER_H_
