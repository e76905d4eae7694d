#include "client/cli/decode_bench_command.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/load_stats.h"
#include "client/cli/random_values.h"
#include "core/util/notification.h"
#include "nlohmann/json.hpp"

namespace attnserve::cli {
namespace {

using Clock = load::LoadClock;

// Extra rows in the pool of random rows beyond the longest prompt, so sessions' prompts and
// steps differ (the values do not change the cost; they only keep outputs from being identical).
constexpr int64_t kPoolSlack = 64;

// One step message's round trip.
struct StepSample {
  Clock::time_point sent;
  Clock::time_point answered;
};

// What the stream threads share: the random rows, the samples and the error counts.
class DecodeBenchState {
 public:
  DecodeBenchState(const DecodeBenchOptions& options, int64_t d_model)
      : options_(options),
        d_model_(d_model),
        pool_rows_(std::max(options.context, options.long_prompt_rows) + kPoolSlack),
        pool_(RandomValues(static_cast<size_t>(pool_rows_ * d_model), options.seed)) {}

  // `rows` rows of the pool from row `first` (wrapping is avoided: first + rows <= pool rows).
  client::TensorView Rows(int64_t first, int64_t rows) const {
    first = first % (pool_rows_ - rows + 1);
    return {std::span<const float>(pool_.data() + first * d_model_,
                                   static_cast<size_t>(rows * d_model_)),
            {rows, d_model_}};
  }

  void RecordStep(const StepSample& sample, const client::DecodeAnswer& answer) {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(sample);
    for (const auto& step : answer.steps) {
      if (step.ok()) {
        ++ok_steps_;
      } else {
        ++errors_[load::StatusCodeName(static_cast<int>(step.status().code()))];
      }
    }
  }
  // A failed item (or a whole failed message, once per item it carried).
  void RecordError(const absl::Status& status, int64_t items = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    errors_[load::StatusCodeName(static_cast<int>(status.code()))] += items;
  }

  // Long prompt: the first stream calls StartLongPrompt at its round; the long-prompt thread
  // waits for it (or for the run's end) in WaitForLongPrompt.
  void StartLongPrompt() {
    std::lock_guard<std::mutex> lock(mu_);
    long_go_ = true;
    changed_.notify_all();
  }
  bool WaitForLongPrompt() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return long_go_ || run_over_; });
    return long_go_;
  }
  void EndRun() {
    std::lock_guard<std::mutex> lock(mu_);
    run_over_ = true;
    changed_.notify_all();
  }
  void SetLongPrompt(Clock::time_point start, Clock::time_point end, absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    long_start_ = start;
    long_end_ = end;
    if (!status.ok()) ++errors_[load::StatusCodeName(static_cast<int>(status.code()))];
  }

  const DecodeBenchOptions& options() const { return options_; }
  int64_t d_model() const { return d_model_; }
  // Read once every thread has joined.
  const std::vector<StepSample>& samples() const { return samples_; }
  int64_t ok_steps() const { return ok_steps_; }
  const std::map<std::string, int64_t>& errors() const { return errors_; }
  std::optional<Clock::time_point> long_start() const { return long_start_; }
  std::optional<Clock::time_point> long_end() const { return long_end_; }

 private:
  const DecodeBenchOptions& options_;
  const int64_t d_model_;
  const int64_t pool_rows_;
  const std::vector<float> pool_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<StepSample> samples_;
  int64_t ok_steps_ = 0;
  std::map<std::string, int64_t> errors_;
  bool long_go_ = false;
  bool run_over_ = false;
  std::optional<Clock::time_point> long_start_, long_end_;
};

// One stream's sessions: global indices [first, first + count).
struct StreamPart {
  int first = 0;
  int count = 0;
};

std::string SessionName(int index) { return absl::StrCat("s", index); }

// Opens the part's sessions and prefills them: the opens and the first prompts in one message,
// then messages of at most options.prefill_message_bytes of prompts. Errors are recorded; false
// when any open or prompt failed (the run cannot go on meaningfully).
bool Prefill(DecodeBenchState& state, client::DecodeStream& stream, StreamPart part) {
  const DecodeBenchOptions& options = state.options();
  const int64_t prompt_bytes =
      options.context * state.d_model() * static_cast<int64_t>(sizeof(float));
  const int end = part.first + part.count;
  bool ok = true, first_message = true;
  // Without prompts, the opens alone.
  for (int i = part.first; ok && (first_message || (options.context > 0 && i < end));) {
    client::DecodeMessage message;
    if (first_message) {
      for (int j = part.first; j < end; ++j) {
        message.opens.push_back({.session = SessionName(j), .model = options.model});
      }
      first_message = false;
    }
    for (int64_t bytes = 0;
         options.context > 0 && i < end &&
         (message.steps.empty() || bytes + prompt_bytes <= options.prefill_message_bytes);
         ++i, bytes += prompt_bytes) {
      message.steps.push_back({.session = SessionName(i), .rows = state.Rows(i, options.context)});
    }
    absl::StatusOr<client::DecodeAnswer> answer = stream.Send(message);
    if (!answer.ok()) {
      state.RecordError(answer.status(), part.count);
      return false;
    }
    for (const auto& opened : answer->opens) {
      if (!opened.ok()) state.RecordError(opened.status());
      ok = ok && opened.ok();
    }
    for (const auto& step : answer->steps) {
      if (!step.ok()) state.RecordError(step.status());
      ok = ok && step.ok();
    }
  }
  return ok;
}

// The part's rounds of one-row steps, one message per round, until `steps` or the deadline.
// Each round is sent by the previous round's answer callback, on the gRPC thread that read the
// answer: no thread of the bench waits per stream, so a round costs the client no wake-up of its
// own (64 one-session streams used to wake 64 threads a round, on the cores the server shares).
// The callback's SendAsync never blocks: its own message's flow-control slot is free by then.
class RoundChain {
 public:
  RoundChain(DecodeBenchState& state, client::DecodeStream& stream, StreamPart part,
             bool starts_long_prompt, std::optional<Clock::time_point> deadline)
      : state_(state),
        stream_(stream),
        part_(part),
        starts_long_prompt_(starts_long_prompt),
        deadline_(deadline) {}

  // Sends the first round; the rest follow from the answers.
  void Start() { SendFrom(0); }
  // Blocks until the last round is answered (or the chain stopped on an error or the deadline).
  void Wait() const { finished_.WaitForNotification(); }

 private:
  // Sends round `round`, or, when a send fails at once, records it and tries the next one.
  void SendFrom(int64_t round) {
    const DecodeBenchOptions& options = state_.options();
    for (; round < options.steps; ++round) {
      if (deadline_ && Clock::now() >= *deadline_) break;
      if (starts_long_prompt_ && round == options.long_prompt_at_round) state_.StartLongPrompt();
      client::DecodeMessage message;
      for (int i = part_.first; i < part_.first + part_.count; ++i) {
        message.steps.push_back(
            {.session = SessionName(i), .rows = state_.Rows(i * 7 + round + options.context, 1)});
      }
      const Clock::time_point sent = Clock::now();
      const absl::Status status = stream_.SendAsync(
          message, [this, round, sent](absl::StatusOr<client::DecodeAnswer> answer) {
            Answered(round, sent, std::move(answer));
          });
      if (status.ok()) return;
      state_.RecordError(status, part_.count);
      if (status.code() == absl::StatusCode::kFailedPrecondition) break;  // The stream ended.
    }
    finished_.Notify();
  }

  void Answered(int64_t round, Clock::time_point sent,
                absl::StatusOr<client::DecodeAnswer> answer) {
    const Clock::time_point answered = Clock::now();
    if (answer.ok()) {
      state_.RecordStep({.sent = sent, .answered = answered}, *answer);
    } else {
      state_.RecordError(answer.status(), part_.count);
      if (answer.status().code() == absl::StatusCode::kFailedPrecondition) {  // Ended.
        finished_.Notify();
        return;
      }
    }
    SendFrom(round + 1);
  }

  DecodeBenchState& state_;
  client::DecodeStream& stream_;
  const StreamPart part_;
  const bool starts_long_prompt_;
  const std::optional<Clock::time_point> deadline_;
  Notification finished_;
};

// The long prompt's own stream: waits for its round, then one message with the open and prompt.
void RunLongPrompt(DecodeBenchState& state, client::Client& client) {
  if (!state.WaitForLongPrompt()) return;
  const DecodeBenchOptions& options = state.options();
  absl::StatusOr<std::unique_ptr<client::DecodeStream>> stream = client.OpenDecodeStream(
      {.wire_dtype = options.wire_dtype, .answer_wire_dtype = options.wire_dtype});
  if (!stream.ok()) {
    state.RecordError(stream.status());
    return;
  }
  client::DecodeMessage message;
  message.opens.push_back({.session = "long", .model = options.model});
  message.steps.push_back({.session = "long", .rows = state.Rows(0, options.long_prompt_rows)});
  const Clock::time_point start = Clock::now();
  absl::StatusOr<client::DecodeAnswer> answer = (*stream)->Send(message);
  const Clock::time_point end = Clock::now();
  absl::Status status = answer.status();
  if (answer.ok() && !answer->opens[0].ok()) status = answer->opens[0].status();
  if (answer.ok() && status.ok() && !answer->steps[0].ok()) status = answer->steps[0].status();
  state.SetLongPrompt(start, end, status);
  (void)(*stream)->Close();
}

// Latency summary (ms) of the samples `keep` selects.
struct LatencySummary {
  int64_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};
template <typename Keep>
LatencySummary Summarise(const std::vector<StepSample>& samples, Keep keep) {
  std::vector<double> ms;
  for (const StepSample& sample : samples) {
    if (keep(sample)) ms.push_back(load::MillisBetween(sample.sent, sample.answered));
  }
  std::sort(ms.begin(), ms.end());
  LatencySummary summary;
  summary.count = static_cast<int64_t>(ms.size());
  if (ms.empty()) return summary;
  summary.p50 = load::Percentile(ms, 0.5);
  summary.p90 = load::Percentile(ms, 0.9);
  summary.p99 = load::Percentile(ms, 0.99);
  summary.max = ms.back();
  double sum = 0;
  for (double v : ms) sum += v;
  summary.mean = sum / static_cast<double>(ms.size());
  return summary;
}

nlohmann::json LatencyJson(const LatencySummary& s) {
  return {{"count", s.count}, {"p50", s.p50}, {"p90", s.p90},
          {"p99", s.p99},     {"max", s.max}, {"mean", s.mean}};
}

std::string LatencyText(const LatencySummary& s) {
  return absl::StrFormat("p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f ms (%d messages)",
                         s.p50, s.p90, s.p99, s.max, s.mean, s.count);
}

struct DecodeBenchResult {
  std::string model;
  int64_t d_model = 0;
  double prefill_s = 0;
  double steps_s = 0;
  double client_cpu_s = 0;
};

void Report(const DecodeBenchState& state, const DecodeBenchResult& result, std::ostream& out) {
  const DecodeBenchOptions& options = state.options();
  const std::vector<StepSample>& samples = state.samples();
  const LatencySummary all = Summarise(samples, [](const StepSample&) { return true; });
  const double tokens_per_s =
      result.steps_s > 0 ? static_cast<double>(state.ok_steps()) / result.steps_s : 0;
  const double messages_per_s =
      result.steps_s > 0 ? static_cast<double>(samples.size()) / result.steps_s : 0;
  const double prefill_tokens = static_cast<double>(options.sessions * options.context);
  std::optional<LatencySummary> before, during, after;
  if (state.long_start() && state.long_end()) {
    const Clock::time_point start = *state.long_start(), end = *state.long_end();
    before = Summarise(samples, [&](const StepSample& s) { return s.answered <= start; });
    during =
        Summarise(samples, [&](const StepSample& s) { return s.sent < end && s.answered > start; });
    after = Summarise(samples, [&](const StepSample& s) { return s.sent >= end; });
  }
  if (options.json) {
    nlohmann::json json = {
        {"model", result.model},
        {"d_model", result.d_model},
        {"sessions", options.sessions},
        {"clients", options.clients},
        {"context", options.context},
        {"steps", options.steps},
        {"prefill_s", result.prefill_s},
        {"prefill_tokens_per_s", result.prefill_s > 0 ? prefill_tokens / result.prefill_s : 0},
        {"step_phase_s", result.steps_s},
        {"decode_tokens", state.ok_steps()},
        {"tokens_per_s", tokens_per_s},
        {"step_messages_per_s", messages_per_s},
        {"step_latency_ms", LatencyJson(all)},
        {"errors", state.errors()},
        {"client_cpu_s", result.client_cpu_s}};
    if (before) {
      json["long_prompt"] = {
          {"rows", options.long_prompt_rows},
          {"at_round", options.long_prompt_at_round},
          {"latency_ms", load::MillisBetween(*state.long_start(), *state.long_end())},
          {"steps_before_ms", LatencyJson(*before)},
          {"steps_during_ms", LatencyJson(*during)},
          {"steps_after_ms", LatencyJson(*after)}};
    }
    out << json.dump() << "\n";
    return;
  }
  out << absl::StrFormat(
      "decode bench: model %s (d_model %d), %d sessions on %d stream(s), context %d, %d rounds\n",
      result.model, result.d_model, options.sessions, options.clients, options.context,
      options.steps);
  out << absl::StrFormat("prefill: %d rows in %.1f ms (%.0f tokens/s)\n",
                         static_cast<int64_t>(prefill_tokens), result.prefill_s * 1000.0,
                         result.prefill_s > 0 ? prefill_tokens / result.prefill_s : 0);
  out << absl::StrFormat(
      "steps: %d tokens in %.3f s: %.1f tokens/s, %.1f step messages/s; client CPU %.2f s\n",
      state.ok_steps(), result.steps_s, tokens_per_s, messages_per_s, result.client_cpu_s);
  out << "step latency (message round trip): " << LatencyText(all) << "\n";
  if (before) {
    out << absl::StrFormat("long prompt: %d rows at round %d, answered in %.1f ms\n",
                           options.long_prompt_rows, options.long_prompt_at_round,
                           load::MillisBetween(*state.long_start(), *state.long_end()));
    out << "  steps before it: " << LatencyText(*before) << "\n";
    out << "  steps during it: " << LatencyText(*during) << "\n";
    out << "  steps after it:  " << LatencyText(*after) << "\n";
  }
  int64_t errors = 0;
  for (const auto& [code, count] : state.errors()) {
    out << "errors " << code << ": " << count << "\n";
    errors += count;
  }
  if (errors == 0) out << "errors: none\n";
}

absl::Status Validate(const DecodeBenchOptions& options) {
  if (options.sessions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sessions: expected >= 1, got ", options.sessions));
  }
  if (options.clients < 1 || options.clients > options.sessions) {
    return absl::InvalidArgumentError(absl::StrCat("--clients: expected 1..", options.sessions,
                                                   " (--sessions), got ", options.clients));
  }
  if (options.context < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context: expected >= 0, got ", options.context));
  }
  if (options.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 1, got ", options.steps));
  }
  if (options.long_prompt_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--long-prompt-rows: expected >= 0, got ", options.long_prompt_rows));
  }
  if (options.long_prompt_rows > 0 &&
      (options.long_prompt_at_round < 0 || options.long_prompt_at_round >= options.steps)) {
    return absl::InvalidArgumentError(absl::StrCat("--long-prompt-at-round: expected 0..",
                                                   options.steps - 1, " (below --steps), got ",
                                                   options.long_prompt_at_round));
  }
  if (options.duration_s < 0) return absl::InvalidArgumentError("--duration must not be negative");
  if (options.prefill_message_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--prefill-message-bytes: expected >= 1, got ",
                                                   options.prefill_message_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeBenchCommand(client::Client& client, const DecodeBenchOptions& options,
                                std::ostream& out) {
  if (absl::Status valid = Validate(options); !valid.ok()) return valid;
  absl::StatusOr<client::ModelInfo> info = client.GetModel(options.model);
  if (!info.ok()) return info.status();
  DecodeBenchState state(options, info->d_model);

  // The sessions split evenly; the first streams take the remainder.
  std::vector<StreamPart> parts;
  std::vector<std::unique_ptr<client::DecodeStream>> streams;
  for (int c = 0, first = 0; c < options.clients; ++c) {
    const int count = options.sessions / options.clients + (c < options.sessions % options.clients);
    parts.push_back({.first = first, .count = count});
    first += count;
    absl::StatusOr<std::unique_ptr<client::DecodeStream>> stream = client.OpenDecodeStream(
        {.wire_dtype = options.wire_dtype, .answer_wire_dtype = options.wire_dtype});
    if (!stream.ok()) return stream.status();
    streams.push_back(*std::move(stream));
  }
  const auto run_all = [&](auto body) {
    std::vector<std::thread> threads;
    for (size_t c = 0; c < streams.size(); ++c) threads.emplace_back(body, c);
    for (std::thread& thread : threads) thread.join();
  };

  DecodeBenchResult result{.model = info->name, .d_model = info->d_model};
  const Clock::time_point prefill_start = Clock::now();
  std::atomic<bool> prefilled{true};
  run_all([&](size_t c) {
    if (!Prefill(state, *streams[c], parts[c])) prefilled = false;
  });
  result.prefill_s = load::MillisBetween(prefill_start, Clock::now()) / 1000.0;

  if (prefilled) {
    const double cpu_start = load::ProcessCpuSeconds();
    const Clock::time_point start = Clock::now();
    std::optional<Clock::time_point> deadline;
    if (options.duration_s > 0) {
      deadline = start + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(options.duration_s));
    }
    std::thread long_prompt;
    if (options.long_prompt_rows > 0)
      long_prompt = std::thread([&] { RunLongPrompt(state, client); });
    std::vector<std::unique_ptr<RoundChain>> chains;
    for (size_t c = 0; c < streams.size(); ++c) {
      chains.push_back(std::make_unique<RoundChain>(
          state, *streams[c], parts[c], c == 0 && options.long_prompt_rows > 0, deadline));
    }
    for (auto& chain : chains) chain->Start();
    for (auto& chain : chains) chain->Wait();
    result.steps_s = load::MillisBetween(start, Clock::now()) / 1000.0;
    result.client_cpu_s = load::ProcessCpuSeconds() - cpu_start;
    state.EndRun();
    if (long_prompt.joinable()) long_prompt.join();
  }
  for (auto& stream : streams) (void)stream->Close();  // Closes every session.

  Report(state, result, out);
  int64_t errors = 0;
  for (const auto& [code, count] : state.errors()) errors += count;
  if (!prefilled) {
    return absl::UnavailableError(
        absl::StrCat("opening or prefilling the sessions failed (", errors, " errors)"));
  }
  if (errors > 0) {
    return absl::UnavailableError(absl::StrCat(errors, " decode items failed"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::cli
