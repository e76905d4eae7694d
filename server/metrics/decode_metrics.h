// DecodeMetrics: the Prometheus metrics of decoding sessions (attnserve.v1 Decode).
//
// Events (built once in the constructor; the hot path only increments or observes cached
// children): attnserve_decode_sessions_closed_total{reason}, attnserve_decode_step_latency_seconds,
// attnserve_decode_iteration_tokens, attnserve_decode_iteration_seconds (one iteration's checks and
// forward passes, without the time its steps waited or their answers), and
// attnserve_decode_tokens_total{kind="prefill|decode"}.
// States, read from the runtime at scrape time (like attnserve_queue_depth, so they cost the
// decoding loop nothing): attnserve_kv_cache_bytes{state="used|capacity"} and
// attnserve_decode_sessions_open. The layer above feeds it (it knows no decoding types).
//
// Thread-safe.
#ifndef ATTNSERVE_SERVER_METRICS_DECODE_METRICS_H_
#define ATTNSERVE_SERVER_METRICS_DECODE_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace attnserve::server::metrics {

// What the scrape-time gauges report.
struct DecodeSnapshot {
  int64_t kv_bytes_used = 0;
  int64_t kv_bytes_capacity = 0;
  int64_t kv_bytes_touched = 0;
  int64_t sessions_open = 0;
};

class DecodeMetrics {
 public:
  // Registers the event families in `registry` (which must outlive this).
  explicit DecodeMetrics(prometheus::Registry& registry);
  DecodeMetrics(const DecodeMetrics&) = delete;
  DecodeMetrics& operator=(const DecodeMetrics&) = delete;

  // The child of attnserve_decode_sessions_closed_total for `reason` (created on the first call;
  // callers cache it: reasons are a small fixed set).
  prometheus::Counter& ClosedCounter(const std::string& reason);
  // One answered step, `seconds` after it was accepted.
  void RecordStep(double seconds) { step_latency_->Observe(seconds); }
  // One iteration of the decoding loop, whose forward passes took `compute_seconds`.
  void RecordIteration(int64_t prefill_tokens, int64_t decode_tokens, double compute_seconds);

  // Where the scrape-time gauges are read. Set once, before the metrics are exposed; the source
  // must stay callable while they are. Unset: no samples.
  void SetSnapshotSource(std::function<DecodeSnapshot()> source);
  // The scrape-time gauges, for the exposer.
  std::shared_ptr<prometheus::Collectable> Gauges() const;

 private:
  class GaugeCollectable;

  prometheus::Family<prometheus::Counter>* closed_;
  prometheus::Histogram* step_latency_;
  prometheus::Histogram* iteration_tokens_;
  prometheus::Histogram* iteration_seconds_;
  prometheus::Counter* prefill_tokens_;
  prometheus::Counter* decode_tokens_;
  std::shared_ptr<GaugeCollectable> gauges_;
};

}  // namespace attnserve::server::metrics

#endif  // ATTNSERVE_SERVER_METRICS_DECODE_METRICS_H_
