#include "server/metrics/decode_metrics.h"

#include <mutex>
#include <utility>
#include <vector>

#include "prometheus/metric_family.h"
#include "server/metrics/server_metrics.h"

namespace attnserve::server::metrics {

class DecodeMetrics::GaugeCollectable final : public prometheus::Collectable {
 public:
  void SetSource(std::function<DecodeSnapshot()> source) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    DecodeSnapshot snapshot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!source_) return {};
      snapshot = source_();
    }
    prometheus::MetricFamily bytes{
        .name = "attnserve_kv_cache_bytes",
        .help =
            "Bytes of the decoding KV cache: in use by sessions, the budget, and the blocks "
            "whose pages were ever written (in use once, or mapped ahead of need).",
        .type = prometheus::MetricType::Gauge,
        .metric = {}};
    for (const auto& [state, value] :
         {std::pair<const char*, int64_t>{"used", snapshot.kv_bytes_used},
          {"capacity", snapshot.kv_bytes_capacity},
          {"touched", snapshot.kv_bytes_touched}}) {
      prometheus::ClientMetric& sample = bytes.metric.emplace_back();
      sample.label = {{.name = "state", .value = state}};
      sample.gauge.value = static_cast<double>(value);
    }
    prometheus::MetricFamily open{.name = "attnserve_decode_sessions_open",
                                  .help = "Decoding sessions open (loading or ready).",
                                  .type = prometheus::MetricType::Gauge,
                                  .metric = {}};
    open.metric.emplace_back().gauge.value = static_cast<double>(snapshot.sessions_open);
    return {std::move(bytes), std::move(open)};
  }

 private:
  mutable std::mutex mu_;
  std::function<DecodeSnapshot()> source_;
};

DecodeMetrics::DecodeMetrics(prometheus::Registry& registry)
    : gauges_(std::make_shared<GaugeCollectable>()) {
  using prometheus::BuildCounter, prometheus::BuildHistogram;
  closed_ = &BuildCounter()
                 .Name("attnserve_decode_sessions_closed_total")
                 .Help(
                     "Decoding sessions closed, by reason: client, idle, evicted, drained, "
                     "owner_gone (the stream that held them ended).")
                 .Register(registry);
  step_latency_ = &BuildHistogram()
                       .Name("attnserve_decode_step_latency_seconds")
                       .Help("Time from a decoding step's acceptance to its answer.")
                       .Register(registry)
                       .Add({}, LatencyBucketsSeconds());
  iteration_tokens_ = &BuildHistogram()
                           .Name("attnserve_decode_iteration_tokens")
                           .Help("Rows (prefill and decode) computed per decoding iteration.")
                           .Register(registry)
                           .Add({}, BatchTokenBuckets());
  iteration_seconds_ =
      &BuildHistogram()
           .Name("attnserve_decode_iteration_seconds")
           .Help(
               "Compute time of one decoding iteration: its steps' checks and forward passes, "
               "without the time the steps waited or were answered.")
           .Register(registry)
           .Add({}, LatencyBucketsSeconds());
  prometheus::Family<prometheus::Counter>& tokens =
      BuildCounter()
          .Name("attnserve_decode_tokens_total")
          .Help("Rows computed by decoding sessions: prefill chunks and one-row decode steps.")
          .Register(registry);
  prefill_tokens_ = &tokens.Add({{"kind", "prefill"}});
  decode_tokens_ = &tokens.Add({{"kind", "decode"}});
}

prometheus::Counter& DecodeMetrics::ClosedCounter(const std::string& reason) {
  return closed_->Add({{"reason", reason}});
}

void DecodeMetrics::RecordIteration(int64_t prefill_tokens, int64_t decode_tokens,
                                    double compute_seconds) {
  iteration_tokens_->Observe(static_cast<double>(prefill_tokens + decode_tokens));
  iteration_seconds_->Observe(compute_seconds);
  prefill_tokens_->Increment(static_cast<double>(prefill_tokens));
  decode_tokens_->Increment(static_cast<double>(decode_tokens));
}

void DecodeMetrics::SetSnapshotSource(std::function<DecodeSnapshot()> source) {
  gauges_->SetSource(std::move(source));
}

std::shared_ptr<prometheus::Collectable> DecodeMetrics::Gauges() const { return gauges_; }

}  // namespace attnserve::server::metrics
