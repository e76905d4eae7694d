#include "server/app/decode_metrics_listener.h"

#include <string>

namespace attnserve::server {

DecodeMetricsListener::DecodeMetricsListener(metrics::DecodeMetrics* metrics) : metrics_(metrics) {
  for (int reason = 0; reason < decoding::kNumCloseReasons; ++reason) {
    closed_[reason] = &metrics_->ClosedCounter(
        std::string(decoding::CloseReasonName(static_cast<decoding::CloseReason>(reason))));
  }
}

void DecodeMetricsListener::OnIteration(const decoding::IterationReport& report) {
  metrics_->RecordIteration(report.prefill_tokens, report.decode_tokens,
                            static_cast<double>(report.compute_us) * 1e-6);
}

void DecodeMetricsListener::OnStepAnswered(int64_t latency_us, const absl::Status& /*status*/) {
  metrics_->RecordStep(static_cast<double>(latency_us) * 1e-6);
}

void DecodeMetricsListener::OnSessionClosed(decoding::SessionId /*id*/,
                                            decoding::CloseReason reason) {
  const int index = static_cast<int>(reason);
  if (index >= 0 && index < decoding::kNumCloseReasons) closed_[index]->Increment();
}

}  // namespace attnserve::server
