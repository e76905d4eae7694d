#include "client/cli/bench_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace attnserve::cli {
namespace {

std::string ModeText(const BenchOptions& options) {
  std::string mode = options.protocol == Protocol::kOip        ? "ModelInfer "
                     : options.protocol == Protocol::kRest     ? "REST infer (binary data) "
                     : options.protocol == Protocol::kRestJson ? "REST infer (JSON) "
                                                               : "";
  mode += options.stream ? absl::StrCat("stream (", options.streams,
                                        options.streams == 1 ? " stream)" : " streams)")
                         : std::string("unary");
  if (options.rate > 0) {
    absl::StrAppendFormat(&mode, ", open loop at %.1f requests/s (%s arrivals)", options.rate,
                          options.arrival == Arrival::kPoisson ? "Poisson" : "fixed-interval");
  } else {
    absl::StrAppend(&mode, ", closed loop, concurrency ", options.concurrency);
  }
  return mode;
}

// "%.<digits>f" of `value` scaled by `scale`, or "n/a" when the answers did not carry it.
std::string Figure(const std::optional<double>& value, int digits, double scale = 1.0) {
  if (!value.has_value()) return "n/a";
  return absl::StrFormat("%.*f", digits, *value * scale);
}

// The value, or JSON null when the answers did not carry it (never a 0 that was not measured).
nlohmann::json OrNull(const std::optional<double>& value) {
  return value.has_value() ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

int64_t ErrorCount(const load::LoadSummary& summary) {
  int64_t errors = 0;
  for (const auto& [code, count] : summary.errors) errors += count;
  return errors;
}

std::string BenchReportText(const BenchRun& run, const load::LoadSummary& summary) {
  const int64_t errors = ErrorCount(summary);
  std::string text = absl::StrFormat("bench: model %s (d_model %d), %s, seq-len %s", run.model,
                                     run.d_model, ModeText(run.options), run.seq_len.ToString());
  if (run.options.warmup_requests > 0) {
    absl::StrAppend(&text, ", after ", run.options.warmup_requests, " warm-up requests");
  }
  text += "\n";
  absl::StrAppendFormat(&text, "requests:    %d (%d ok, %d errors) in %.2f s\n",
                        summary.ok + errors, summary.ok, errors, summary.elapsed_s);
  absl::StrAppendFormat(&text, "throughput:  %.1f requests/s, %.0f tokens/s\n", summary.rps,
                        summary.tokens_per_s);
  absl::StrAppendFormat(&text,
                        "latency ms:  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  "
                        "(mean %.3f)\n",
                        summary.p50_ms, summary.p90_ms, summary.p99_ms, summary.p999_ms,
                        summary.max_ms, summary.mean_ms);
  absl::StrAppend(&text, "server:      batches of ", Figure(summary.mean_batch_sequences, 1),
                  " sequences / ", Figure(summary.mean_batch_tokens, 0),
                  " tokens (request-weighted mean), queue ", Figure(summary.mean_queue_us, 0),
                  " us, compute ", Figure(summary.mean_compute_us, 0), " us\n");
  absl::StrAppend(&text, "batches:     ", Figure(summary.batches, 0), ", ",
                  Figure(summary.batch_mean_sequences, 2),
                  " sequences per batch; server in Forward ", Figure(summary.compute_busy, 1, 100),
                  " % of the time\n");
  if (summary.mean_request_bytes > 0) {  // Only Attend answers carry their serialized sizes.
    absl::StrAppendFormat(&text,
                          "wire:        %s raw, %.0f bytes per request, %.0f per answer "
                          "(serialized protobuf, means)\n",
                          client::WireDtypeName(run.options.wire_dtype), summary.mean_request_bytes,
                          summary.mean_response_bytes);
  }
  absl::StrAppendFormat(
      &text, "client CPU:  %.2f s (%.0f us per ok request)\n", summary.client_cpu_s,
      summary.ok > 0 ? summary.client_cpu_s * 1e6 / static_cast<double>(summary.ok) : 0.0);
  if (errors > 0) {
    text += "errors:     ";
    for (const auto& [code, count] : summary.errors) absl::StrAppend(&text, " ", code, " ", count);
    text += "\n";
  }
  return text;
}

std::string BenchReportJson(const BenchRun& run, const load::LoadSummary& summary) {
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [code, count] : summary.errors) errors[code] = count;
  const BenchOptions& options = run.options;
  nlohmann::json report = {
      {"model", run.model},
      {"protocol", ProtocolName(options.protocol)},
      {"d_model", run.d_model},
      {"mode", options.rate > 0 ? "open" : "closed"},
      {"stream", options.stream},
      {"streams", options.stream ? options.streams : 0},
      {"concurrency", options.concurrency},
      {"rate", options.rate},
      {"arrival", options.arrival == Arrival::kPoisson ? "poisson" : "fixed"},
      {"seq_len", run.seq_len.ToString()},
      {"seed", options.seed},
      {"warmup_requests", options.warmup_requests},
      {"requests", summary.ok + ErrorCount(summary)},
      {"ok", summary.ok},
      {"errors", errors},
      {"elapsed_s", summary.elapsed_s},
      {"requests_per_s", summary.rps},
      {"tokens_per_s", summary.tokens_per_s},
      {"latency_ms",
       {{"p50", summary.p50_ms},
        {"p90", summary.p90_ms},
        {"p99", summary.p99_ms},
        {"p99.9", summary.p999_ms},
        {"max", summary.max_ms},
        {"mean", summary.mean_ms}}},
      {"server",
       {{"mean_batch_sequences", OrNull(summary.mean_batch_sequences)},
        {"mean_batch_tokens", OrNull(summary.mean_batch_tokens)},
        {"mean_queue_us", OrNull(summary.mean_queue_us)},
        {"mean_compute_us", OrNull(summary.mean_compute_us)},
        {"batches", OrNull(summary.batches)},
        {"batch_mean_sequences", OrNull(summary.batch_mean_sequences)},
        {"compute_busy", OrNull(summary.compute_busy)}}},
      {"client_cpu_s", summary.client_cpu_s},
      {"wire_dtype", std::string(client::WireDtypeName(options.wire_dtype))},
      {"wire_bytes",
       {{"mean_request", summary.mean_request_bytes},
        {"mean_response", summary.mean_response_bytes}}},
  };
  return report.dump() + "\n";
}

}  // namespace attnserve::cli
