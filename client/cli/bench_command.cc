#include "client/cli/bench_command.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/bench_report.h"
#include "client/cli/load_stats.h"
#include "client/cli/random_values.h"

namespace attnserve::cli {
namespace {

using Clock = load::LoadClock;

// Decorrelates the arrival times from the input values, which use the seed as it is.
constexpr uint64_t kArrivalSeedSalt = 0xA55A5AA5F00DF00DULL;

// Everything the senders and the answer callbacks share. Callbacks run on gRPC threads; every
// member they touch is thread-safe.
class BenchState {
 public:
  // `infer`: non-null sends ModelInfer instead of Attend.
  BenchState(client::Client& client, client::InferClient* infer, const BenchOptions& options,
             const BenchRun& run, std::optional<Clock::time_point> deadline)
      : client_(client),
        infer_(infer),
        options_(options),
        run_(run),
        values_(RandomValues(static_cast<size_t>(run.seq_len.max * run.d_model), options.seed)),
        budget_(options.requests, deadline),
        recorder_(1, 0) {
    attend_.mask = options.causal ? client::Mask::kCausal : client::Mask::kNone;
    attend_.deadline = options.deadline;
    infer_options_.mask = attend_.mask;
    infer_options_.deadline = options.deadline;
    attend_.wire_dtype = options.wire_dtype;
    attend_.answer_wire_dtype = options.wire_dtype;
  }

  client::Client& client() { return client_; }
  client::InferClient* infer() { return infer_; }
  const client::InferOptions& infer_options() const { return infer_options_; }
  load::LoadBudget& budget() { return budget_; }
  load::LoadRecorder& recorder() { return recorder_; }
  load::LoadWorkGroup& in_flight() { return in_flight_; }
  const client::AttendOptions& attend_options() const { return attend_; }
  const std::string& model() const { return options_.model; }
  int64_t ok() const { return ok_.load(std::memory_order_relaxed); }
  int64_t failed() const { return failed_.load(std::memory_order_relaxed); }

  // The next request's input: the first T rows of the shared random values, T from the
  // request's index. Views stay valid for the whole run (the library copies them anyway).
  client::TensorView NextInput() {
    const int64_t index = next_index_.fetch_add(1, std::memory_order_relaxed);
    const int64_t length = run_.seq_len.For(options_.seed, index);
    return {std::span<const float>(values_.data(), static_cast<size_t>(length * run_.d_model)),
            {length, run_.d_model}};
  }

  // Records one answer. `scheduled`: the open-loop send time latency counts from; otherwise the
  // library's own measurement (call start to answer, excluding stream flow-control waits).
  void Record(const absl::StatusOr<client::AttendResult>& result, int64_t tokens,
              std::optional<Clock::time_point> scheduled) {
    if (!result.ok()) {
      RecordError(result.status());
      return;
    }
    const client::Timing& timing = result->timing;
    recorder_.RecordWireBytes(result->request_bytes, result->response_bytes);
    RecordOk(result->latency,
             {.batch_sequences = timing.batch_sequences,
              .batch_tokens = timing.batch_tokens,
              .queue_us = timing.queue_us,
              .compute_us = timing.compute_us},
             tokens, scheduled);
  }
  // The same for a ModelInfer answer, which has no batch_tokens (left absent).
  void Record(const absl::StatusOr<client::InferResult>& result, int64_t tokens,
              std::optional<Clock::time_point> scheduled) {
    if (!result.ok()) {
      RecordError(result.status());
      return;
    }
    const client::InferTiming& timing = result->timing;
    RecordOk(result->latency,
             {.batch_sequences = timing.batch_sequences,
              .batch_tokens = std::nullopt,
              .queue_us = timing.queue_us,
              .compute_us = timing.compute_us},
             tokens, scheduled);
  }
  void RecordOk(std::chrono::microseconds latency, const load::AnswerTiming& timing, int64_t tokens,
                std::optional<Clock::time_point> scheduled) {
    const double latency_ms = scheduled.has_value() ? load::MillisBetween(*scheduled, Clock::now())
                                                    : static_cast<double>(latency.count()) / 1000.0;
    recorder_.RecordOk(latency_ms, timing, tokens);
    ok_.fetch_add(1, std::memory_order_relaxed);
  }
  void RecordError(const absl::Status& status) {
    // absl::StatusCode numbers are gRPC's.
    recorder_.RecordError(static_cast<int>(status.code()));
    failed_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  client::Client& client_;
  client::InferClient* const infer_;
  const BenchOptions& options_;
  const BenchRun& run_;
  const std::vector<float> values_;
  client::AttendOptions attend_;
  client::InferOptions infer_options_;
  load::LoadBudget budget_;
  load::LoadRecorder recorder_;
  load::LoadWorkGroup in_flight_;
  std::atomic<int64_t> next_index_{0};
  std::atomic<int64_t> ok_{0};
  std::atomic<int64_t> failed_{0};
};

// Sends one unary request (Attend or ModelInfer, as the run says); `after` runs on the gRPC
// thread once the answer is recorded, before the request counts as retired. It must not block.
void SendUnary(BenchState& state, std::optional<Clock::time_point> scheduled,
               std::function<void()> after) {
  const client::TensorView input = state.NextInput();
  const int64_t tokens = input.shape[0];
  state.in_flight().Add(1);
  if (state.infer() != nullptr) {
    state.infer()->InferAsync(
        state.model(), input, state.infer_options(),
        [&state, tokens, scheduled, after](absl::StatusOr<client::InferResult> r) {
          state.Record(r, tokens, scheduled);
          after();
          state.in_flight().Done();
        });
    return;
  }
  state.client().AttendAsync(
      state.model(), input, state.attend_options(),
      [&state, tokens, scheduled, after](absl::StatusOr<client::AttendResult> r) {
        state.Record(r, tokens, scheduled);
        after();
        state.in_flight().Done();
      });
}

// Unary, closed loop: `concurrency` slots; an answer frees its slot for the next request. The
// callback only records and releases (it must not block a gRPC thread).
void RunUnaryClosed(BenchState& state, int concurrency) {
  std::counting_semaphore<> slots(concurrency);
  while (true) {
    slots.acquire();
    if (!state.budget().TryTake()) break;
    SendUnary(state, std::nullopt, [&slots] { slots.release(); });
  }
  state.in_flight().Wait();
}

// Unary, open loop: one sender keeps the schedule, however many calls are outstanding.
void RunUnaryOpen(BenchState& state, ArrivalSchedule& schedule) {
  while (state.budget().TryTake()) {
    const Clock::time_point at = schedule.Next();
    std::this_thread::sleep_until(at);  // Pacing, not synchronisation.
    SendUnary(state, at, [] {});
  }
  state.in_flight().Wait();
}

// Sends one request over `session`; false once the stream has ended (nothing more can be sent).
bool SendOnStream(BenchState& state, client::AttendSession& session,
                  std::optional<Clock::time_point> scheduled) {
  const client::TensorView input = state.NextInput();
  const int64_t tokens = input.shape[0];
  state.in_flight().Add(1);
  const absl::Status sent =
      session.Attend(state.model(), input, state.attend_options(),
                     [&state, tokens, scheduled](absl::StatusOr<client::AttendResult> r) {
                       state.Record(r, tokens, scheduled);
                       state.in_flight().Done();
                     });
  if (sent.ok()) return true;
  state.RecordError(sent);
  state.in_flight().Done();
  return sent.code() != absl::StatusCode::kFailedPrecondition;
}

// Stream mode: `sessions` are open; closed loop gives each its own sender thread (the session's
// max_in_flight is the concurrency), open loop one sender round-robin over them.
void RunStreams(BenchState& state, std::vector<std::unique_ptr<client::AttendSession>>& sessions,
                ArrivalSchedule* schedule, std::ostream& err) {
  if (schedule == nullptr) {
    std::vector<std::thread> senders;
    for (auto& session : sessions) {
      senders.emplace_back([&state, &session] {
        while (state.budget().TryTake() && SendOnStream(state, *session, std::nullopt)) {
        }
      });
    }
    for (std::thread& sender : senders) sender.join();
  } else {
    size_t next = 0;
    std::vector<bool> ended(sessions.size(), false);
    size_t alive = sessions.size();
    while (alive > 0 && state.budget().TryTake()) {
      while (ended[next]) next = (next + 1) % sessions.size();
      const Clock::time_point at = schedule->Next();
      std::this_thread::sleep_until(at);  // Pacing, not synchronisation.
      if (!SendOnStream(state, *sessions[next], at)) {
        ended[next] = true;
        --alive;
      }
      next = (next + 1) % sessions.size();
    }
  }
  for (size_t i = 0; i < sessions.size(); ++i) {
    const absl::Status closed = sessions[i]->Close();
    if (!closed.ok()) err << "stream " << i << " ended with " << closed << "\n";
  }
  state.in_flight().Wait();
}

// Prints "elapsed, ok, errors, rate over the last second" to `err` about once a second, on one
// line rewritten with \r, until destroyed.
class ProgressLine {
 public:
  ProgressLine(const BenchState& state, std::ostream& err, Clock::time_point start)
      : state_(state), err_(err), start_(start), thread_([this] { Run(); }) {}
  ~ProgressLine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    changed_.notify_all();
    thread_.join();
    if (printed_) err_ << "\n";
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    int64_t last_ok = 0;
    Clock::time_point last = start_;
    while (!changed_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; })) {
      const Clock::time_point now = Clock::now();
      const int64_t ok = state_.ok();
      const double rate =
          static_cast<double>(ok - last_ok) / std::chrono::duration<double>(now - last).count();
      err_ << absl::StrFormat("\r%7.1f s  %9d ok  %6d errors  %9.1f requests/s ",
                              std::chrono::duration<double>(now - start_).count(), ok,
                              state_.failed(), rate)
           << std::flush;
      printed_ = true;
      last_ok = ok;
      last = now;
    }
  }

  const BenchState& state_;
  std::ostream& err_;
  const Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool done_ = false;
  bool printed_ = false;
  std::thread thread_;  // Last: starts once the members above exist.
};

absl::Status Validate(const BenchOptions& options) {
  if (options.concurrency < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--concurrency: expected >= 1, got ", options.concurrency));
  }
  if (options.streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--streams: expected >= 1, got ", options.streams));
  }
  if (options.rate < 0 || options.duration_s < 0 || options.requests < 0 ||
      options.warmup_requests < 0) {
    return absl::InvalidArgumentError(
        "--rate, --duration, --requests and --warmup-requests must not be negative");
  }
  if (UsesInferClient(options.protocol) && options.stream) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stream: AttendStream exists only in attnserve.v1; with --protocol ",
                     ProtocolName(options.protocol),
                     " the requests are unary infer calls (drop --stream or use --protocol v1)"));
  }
  if (UsesInferClient(options.protocol) && options.wire_dtype != client::WireDtype::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--wire-dtype ", std::string(client::WireDtypeName(options.wire_dtype)),
                     ": with --protocol ", ProtocolName(options.protocol),
                     " the input is sent as FP32 (expected --wire-dtype fp32)"));
  }
  return absl::OkStatus();
}

// One phase of the run: `options.requests` requests (0 = no count limit) or `options.duration_s`
// seconds (0 = no time limit), whichever ends first, with the run's load. Stream mode opens its
// sessions for the phase and closes them at its end.
absl::StatusOr<load::LoadSummary> RunPhase(client::Client& client, client::InferClient* infer,
                                           const BenchOptions& options, const BenchRun& run,
                                           std::ostream& err) {
  std::vector<std::unique_ptr<client::AttendSession>> sessions;
  if (options.stream) {
    for (int i = 0; i < options.streams; ++i) {
      // Closed loop: the concurrency split evenly (the first streams take the remainder).
      const int max_in_flight = options.rate > 0
                                    ? options.concurrency
                                    : std::max(1, options.concurrency / options.streams +
                                                      (i < options.concurrency % options.streams));
      absl::StatusOr<std::unique_ptr<client::AttendSession>> session =
          client.OpenSession(max_in_flight);
      if (!session.ok()) return session.status();
      sessions.push_back(*std::move(session));
    }
  }

  const Clock::time_point start = Clock::now();
  std::optional<Clock::time_point> deadline;
  if (options.duration_s > 0) {
    deadline = start + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(options.duration_s));
  }
  BenchState state(client, UsesInferClient(options.protocol) ? infer : nullptr, options, run,
                   deadline);
  ArrivalSchedule schedule(options.rate, options.arrival, options.seed ^ kArrivalSeedSalt, start);
  state.recorder().Start();
  {
    std::optional<ProgressLine> progress;
    if (options.progress) progress.emplace(state, err, start);
    if (options.stream) {
      RunStreams(state, sessions, options.rate > 0 ? &schedule : nullptr, err);
    } else if (options.rate > 0) {
      RunUnaryOpen(state, schedule);
    } else {
      RunUnaryClosed(state, options.concurrency);
    }
  }
  return state.recorder().Finish();
}

}  // namespace

const char* ProtocolName(Protocol protocol) {
  switch (protocol) {
    case Protocol::kOip:
      return "oip";
    case Protocol::kRest:
      return "rest";
    case Protocol::kRestJson:
      return "rest-json";
    case Protocol::kV1:
      break;
  }
  return "v1";
}

absl::Status BenchCommand(client::Client& client, client::InferClient* infer,
                          const BenchOptions& options, std::ostream& out, std::ostream& err) {
  if (absl::Status valid = Validate(options); !valid.ok()) return valid;
  if (UsesInferClient(options.protocol) && infer == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--protocol ", ProtocolName(options.protocol), ": no infer client was given"));
  }
  absl::StatusOr<SeqLenRange> seq_len = SeqLenRange::Parse(options.seq_len);
  if (!seq_len.ok()) return seq_len.status();
  absl::StatusOr<client::ModelInfo> info = client.GetModel(options.model);
  if (!info.ok()) return info.status();
  if (info->max_sequence_length > 0 && seq_len->max > info->max_sequence_length) {
    return absl::InvalidArgumentError(absl::StrCat("--seq-len ", seq_len->ToString(), ": model \"",
                                                   info->name, "\" accepts up to ",
                                                   info->max_sequence_length, " rows"));
  }

  BenchOptions effective = options;
  // REST names the model in its URL: the one GetModel resolved.
  if (effective.model.empty()) effective.model = info->name;
  if (effective.requests == 0 && effective.duration_s == 0) {
    effective.requests = kDefaultBenchRequests;
  }
  const BenchRun run{
      .options = effective, .model = info->name, .d_model = info->d_model, .seq_len = *seq_len};

  if (effective.warmup_requests > 0) {
    BenchOptions warmup = effective;
    warmup.requests = effective.warmup_requests;
    warmup.duration_s = 0;
    warmup.progress = false;
    absl::StatusOr<load::LoadSummary> warm = RunPhase(client, infer, warmup, run, err);
    if (!warm.ok()) return warm.status();
    if (const int64_t errors = ErrorCount(*warm); errors > 0) {
      err << "warm-up: " << errors << " of " << errors + warm->ok
          << " requests failed (not counted)\n";
    }
  }
  absl::StatusOr<load::LoadSummary> measured = RunPhase(client, infer, effective, run, err);
  if (!measured.ok()) return measured.status();
  const load::LoadSummary& summary = *measured;

  out << (effective.json ? BenchReportJson(run, summary) : BenchReportText(run, summary));
  const int64_t errors = ErrorCount(summary);
  if (errors > 0) {
    return absl::UnavailableError(
        absl::StrCat(errors, " of ", errors + summary.ok, " requests failed"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::cli
