#include "client/cli/load_stats.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"

namespace attnserve::load {

double MillisBetween(LoadClock::time_point start, LoadClock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

LoadBudget::LoadBudget(int64_t max_requests, std::optional<LoadClock::time_point> deadline)
    : max_requests_(max_requests), deadline_(deadline) {}

bool LoadBudget::TryTake() {
  if (closed_.load(std::memory_order_relaxed)) return false;
  if (deadline_.has_value() && LoadClock::now() >= *deadline_) {
    closed_.store(true, std::memory_order_relaxed);
    return false;
  }
  if (max_requests_ > 0 && taken_.fetch_add(1, std::memory_order_relaxed) >= max_requests_) {
    closed_.store(true, std::memory_order_relaxed);
    return false;
  }
  granted_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void LoadWorkGroup::Add(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  active_ += n;
}

void LoadWorkGroup::Done() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--active_ == 0) cv_.notify_all();
}

void LoadWorkGroup::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return active_ == 0; });
}

LoadRecorder::LoadRecorder(int64_t sequences_per_request, int64_t tokens_per_request)
    : sequences_per_request_(sequences_per_request), tokens_per_request_(tokens_per_request) {}

void LoadRecorder::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  start_ = LoadClock::now();
  start_cpu_s_ = ProcessCpuSeconds();
}

void LoadRecorder::RecordOk(double latency_ms, const AnswerTiming& timing, int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  latencies_ms_.push_back(latency_ms);
  sum_tokens_ += static_cast<double>(tokens >= 0 ? tokens : tokens_per_request_);
  auto add = [](const std::optional<int64_t>& value, double& sum, int64_t& count) {
    if (!value.has_value()) return;
    sum += static_cast<double>(*value);
    ++count;
  };
  add(timing.batch_sequences, sum_batch_sequences_, with_batch_sequences_);
  add(timing.batch_tokens, sum_batch_tokens_, with_batch_tokens_);
  add(timing.queue_us, sum_queue_us_, with_queue_us_);
  add(timing.compute_us, sum_compute_us_, with_compute_us_);
  if (timing.batch_sequences.has_value() && timing.compute_us.has_value()) {
    ++with_batch_compute_;
    if (*timing.batch_sequences > 0) {
      const double share = static_cast<double>(sequences_per_request_) /
                           static_cast<double>(*timing.batch_sequences);
      batches_ += share;
      sum_batch_compute_us_ += share * static_cast<double>(*timing.compute_us);
    }
  }
}

void LoadRecorder::RecordWireBytes(int64_t request_bytes, int64_t response_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  sum_request_bytes_ += static_cast<double>(request_bytes);
  sum_response_bytes_ += static_cast<double>(response_bytes);
}

void LoadRecorder::RecordError(int code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++errors_[StatusCodeName(code)];
}

LoadSummary LoadRecorder::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  LoadSummary summary;
  summary.elapsed_s = std::chrono::duration<double>(LoadClock::now() - start_).count();
  summary.client_cpu_s = ProcessCpuSeconds() - start_cpu_s_;
  summary.ok = static_cast<int64_t>(latencies_ms_.size());
  summary.errors = errors_;
  if (summary.elapsed_s > 0) {
    summary.rps = static_cast<double>(summary.ok) / summary.elapsed_s;
    summary.tokens_per_s = sum_tokens_ / summary.elapsed_s;
  }
  if (summary.ok == 0) return summary;
  std::vector<double> sorted = latencies_ms_;
  std::sort(sorted.begin(), sorted.end());
  summary.p50_ms = Percentile(sorted, 0.50);
  summary.p90_ms = Percentile(sorted, 0.90);
  summary.p99_ms = Percentile(sorted, 0.99);
  summary.p999_ms = Percentile(sorted, 0.999);
  summary.max_ms = sorted.back();
  const double n = static_cast<double>(summary.ok);
  summary.mean_ms = std::accumulate(sorted.begin(), sorted.end(), 0.0) / n;
  // A figure only when every OK answer carried what it is made of.
  auto mean = [&summary](double sum, int64_t count) -> std::optional<double> {
    if (count != summary.ok) return std::nullopt;
    return sum / static_cast<double>(count);
  };
  summary.mean_batch_sequences = mean(sum_batch_sequences_, with_batch_sequences_);
  summary.mean_batch_tokens = mean(sum_batch_tokens_, with_batch_tokens_);
  summary.mean_queue_us = mean(sum_queue_us_, with_queue_us_);
  summary.mean_compute_us = mean(sum_compute_us_, with_compute_us_);
  summary.mean_request_bytes = sum_request_bytes_ / n;
  summary.mean_response_bytes = sum_response_bytes_ / n;
  if (with_batch_compute_ == summary.ok) {
    summary.batches = batches_;
    summary.batch_mean_sequences =
        batches_ > 0 ? n * static_cast<double>(sequences_per_request_) / batches_ : 0.0;
    summary.compute_busy =
        summary.elapsed_s > 0 ? sum_batch_compute_us_ * 1e-6 / summary.elapsed_s : 0.0;
  }
  return summary;
}

std::string StatusCodeName(int code) {
  // gRPC's codes are absl's, number for number, and absl names them as gRPC does.
  if (code >= 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  }
  return "CODE_" + std::to_string(code);
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(q * static_cast<double>(sorted.size()));
  const size_t index = static_cast<size_t>(std::max(1.0, rank)) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace attnserve::load
