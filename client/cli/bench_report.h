// The report `attnserve-cli bench` prints at the end of a run: human-readable text, or one JSON
// object for scripts. Pure formatting, thread-safe.
#ifndef ATTNSERVE_CLIENT_CLI_BENCH_REPORT_H_
#define ATTNSERVE_CLIENT_CLI_BENCH_REPORT_H_

#include <string>

#include "client/cli/bench_command.h"
#include "client/cli/load_stats.h"

namespace attnserve::cli {

// What was run, for the report's header.
struct BenchRun {
  BenchOptions options;
  std::string model;  // The model that answered GetModel (the default model's name for "").
  int64_t d_model = 0;
  SeqLenRange seq_len;
};

// Several lines ending in a newline.
std::string BenchReportText(const BenchRun& run, const load::LoadSummary& summary);
// One JSON object on one line, ending in a newline: "requests", "ok", "errors" (code name ->
// count), "elapsed_s", "requests_per_s", "tokens_per_s", "latency_ms" {"p50", "p90", "p99",
// "p99.9", "max", "mean"}, "server" {"mean_batch_sequences", "mean_batch_tokens", "mean_queue_us",
// "mean_compute_us" (request-weighted means of the answers' Timing), "batches",
// "batch_mean_sequences" (per batch), "compute_busy" (share of the wall time the server spent in
// Forward for these answers)}, "client_cpu_s" (this process, user + system), "wire_dtype",
// "wire_bytes" {"mean_request", "mean_response"} (serialized protobuf sizes; 0 with --protocol
// oip), and the run's settings ("protocol" and "warmup_requests" among them). Every figure covers
// the measured requests only. A server figure the answers do not carry (mean_batch_tokens with
// --protocol oip) is null in JSON and "n/a" in text.
std::string BenchReportJson(const BenchRun& run, const load::LoadSummary& summary);

// Total errors in `summary`.
int64_t ErrorCount(const load::LoadSummary& summary);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_BENCH_REPORT_H_
