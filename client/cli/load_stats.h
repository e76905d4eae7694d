// Load-generator statistics of attnserve-cli bench: what a run collects and how it summarises it
// (tests/benchmarks/attnserve_offline_bench reuses Percentile, ProcessCpuSeconds and the clock).
//
// LoadBudget hands out the right to send one more request (bounded by a count and a deadline);
// LoadRecorder collects each answer's client-side latency, its gRPC code and the server's Timing;
// LoadWorkGroup lets the main thread wait for every closed-loop slot to retire. All three are
// thread-safe: gRPC callbacks on its own threads call them concurrently.
#ifndef ATTNSERVE_CLIENT_CLI_LOAD_STATS_H_
#define ATTNSERVE_CLIENT_CLI_LOAD_STATS_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace attnserve::load {

using LoadClock = std::chrono::steady_clock;

// Milliseconds from `start` to `end`.
double MillisBetween(LoadClock::time_point start, LoadClock::time_point end);

// Grants requests until `max_requests` have been granted (0 = no count limit) or `deadline`
// (if set) has passed, whichever comes first. Once it refuses, it refuses for good.
class LoadBudget {
 public:
  LoadBudget(int64_t max_requests, std::optional<LoadClock::time_point> deadline);
  bool TryTake();
  int64_t granted() const { return granted_.load(std::memory_order_relaxed); }

 private:
  const int64_t max_requests_;
  const std::optional<LoadClock::time_point> deadline_;
  std::atomic<int64_t> taken_{0};
  std::atomic<int64_t> granted_{0};
  std::atomic<bool> closed_{false};
};

// Counts outstanding workers; Wait() returns once each Add()ed one has called Done().
class LoadWorkGroup {
 public:
  void Add(int n);
  void Done();
  void Wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;
};

// The server's account of one answer (its batch). A field the protocol's answer does not carry
// is empty: the Open Inference Protocol's ModelInfer answer has no batch_tokens.
struct AnswerTiming {
  std::optional<int64_t> batch_sequences = {};
  std::optional<int64_t> batch_tokens = {};
  std::optional<int64_t> queue_us = {};
  std::optional<int64_t> compute_us = {};
};

// The summary of one measured phase.
struct LoadSummary {
  int64_t ok = 0;
  std::map<std::string, int64_t> errors;  // gRPC code name -> count
  double elapsed_s = 0;
  double rps = 0;
  double tokens_per_s = 0;
  // Client-side latency of the OK requests, ms (nearest-rank percentiles).
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, p999_ms = 0, max_ms = 0, mean_ms = 0;
  // The server-side figures below are empty (absent, not 0) unless every OK answer carried the
  // AnswerTiming fields they are made of.
  // Means over the OK answers' timing (request-weighted: a batch of b sequences is counted b
  // times when every request carries one sequence).
  std::optional<double> mean_batch_sequences, mean_batch_tokens, mean_queue_us, mean_compute_us;
  // Per batch, reconstructed from the answers (batch_sequences): a batch of b sequences answers
  // b/B requests that each report b, so Σ B/b over the answers counts batches. Exact when every
  // request has the same B and all of a batch's requests are measured.
  std::optional<double> batches;
  std::optional<double> batch_mean_sequences;  // Sequences per batch, averaged over batches.
  // Σ per-batch compute_us / elapsed (batch_sequences and compute_us): the share of wall time the
  // server spent in Forward for these answers.
  std::optional<double> compute_busy;
  // This process's CPU time (user + system) during the phase, seconds.
  double client_cpu_s = 0;
  // Mean serialized protobuf sizes of the OK requests and their answers, bytes (0 when the
  // caller records none: RecordWireBytes).
  double mean_request_bytes = 0, mean_response_bytes = 0;
};

class LoadRecorder {
 public:
  // `sequences_per_request` (B) and `tokens_per_request` (B·T): what one OK request carries
  // unless RecordOk says otherwise.
  LoadRecorder(int64_t sequences_per_request, int64_t tokens_per_request);

  // Marks the beginning of the measured phase (wall clock and CPU time).
  void Start();
  // `tokens`: the query tokens this request carried, when lengths vary (-1 = tokens_per_request).
  void RecordOk(double latency_ms, const AnswerTiming& timing, int64_t tokens = -1);
  // The serialized sizes of one OK request and its answer, bytes (optional, once per RecordOk).
  void RecordWireBytes(int64_t request_bytes, int64_t response_bytes);
  // `code`: a grpc::StatusCode number.
  void RecordError(int code);
  // Marks the end (call after every answer is in) and summarises.
  LoadSummary Finish();

 private:
  const int64_t sequences_per_request_;
  const int64_t tokens_per_request_;
  std::mutex mu_;
  std::vector<double> latencies_ms_;
  std::map<std::string, int64_t> errors_;
  double sum_batch_sequences_ = 0, sum_batch_tokens_ = 0, sum_queue_us_ = 0, sum_compute_us_ = 0;
  double batches_ = 0, sum_batch_compute_us_ = 0;
  // OK answers that carried each AnswerTiming field (batch_sequences and compute_us together for
  // the last).
  int64_t with_batch_sequences_ = 0, with_batch_tokens_ = 0, with_queue_us_ = 0,
          with_compute_us_ = 0, with_batch_compute_ = 0;
  double sum_tokens_ = 0;  // Query tokens of the OK requests.
  double sum_request_bytes_ = 0, sum_response_bytes_ = 0;
  LoadClock::time_point start_;
  double start_cpu_s_ = 0;
};

// The canonical name of a grpc::StatusCode number ("OK", "UNAVAILABLE", ...), or "CODE_<n>".
std::string StatusCodeName(int code);

// The value at quantile q (0 < q <= 1) of sorted `values` (nearest rank); 0 when empty.
double Percentile(const std::vector<double>& sorted, double q);

// User + system CPU seconds this process has used so far.
double ProcessCpuSeconds();

}  // namespace attnserve::load

#endif  // ATTNSERVE_CLIENT_CLI_LOAD_STATS_H_
