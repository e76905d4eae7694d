// DecodeMetricsListener: feeds the decoding runtime's events (decoding::DecodeListener) into
// metrics::DecodeMetrics. The close counters of every reason are created in the constructor, so
// each callback only increments or observes (they run on the decoding loop thread).
//
// Thread-safe. `metrics` must outlive the listener.
#ifndef ATTNSERVE_SERVER_APP_DECODE_METRICS_LISTENER_H_
#define ATTNSERVE_SERVER_APP_DECODE_METRICS_LISTENER_H_

#include <array>

#include "server/decoding/decode_types.h"
#include "server/metrics/decode_metrics.h"

namespace attnserve::server {

class DecodeMetricsListener final : public decoding::DecodeListener {
 public:
  explicit DecodeMetricsListener(metrics::DecodeMetrics* metrics);

  void OnIteration(const decoding::IterationReport& report) override;
  void OnStepAnswered(int64_t latency_us, const absl::Status& status) override;
  void OnSessionClosed(decoding::SessionId id, decoding::CloseReason reason) override;

 private:
  metrics::DecodeMetrics* const metrics_;
  std::array<prometheus::Counter*, decoding::kNumCloseReasons> closed_{};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_DECODE_METRICS_LISTENER_H_
