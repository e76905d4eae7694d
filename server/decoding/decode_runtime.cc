#include "server/decoding/decode_runtime.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/forward/finite_values.h"

namespace attnserve::decoding {
namespace {

// Bytes of KV blocks the idle loop maps per slice (two fp32 blocks of d_model 512, 32 pages):
// between slices it takes its lock and looks for work; within one, work stops it at a page.
constexpr int64_t kPrefaultSliceBytes = int64_t{128} << 10;

}  // namespace

std::string_view CloseReasonName(CloseReason reason) {
  switch (reason) {
    case CloseReason::kClient:
      return "client";
    case CloseReason::kIdle:
      return "idle";
    case CloseReason::kEvicted:
      return "evicted";
    case CloseReason::kDrained:
      return "drained";
    case CloseReason::kOwnerGone:
      return "owner_gone";
  }
  return "unknown";
}

absl::Status ValidateDecodeRuntimeOptions(const DecodeRuntimeOptions& options) {
  if (absl::Status s = batching::ValidateIterationSchedulerOptions(options.scheduling); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("scheduling.", s.message()));
  }
  const std::pair<const char*, int64_t> positive[] = {
      {"kv.budget_bytes", options.kv.budget_bytes},
      {"kv.block_tokens", options.kv.block_tokens},
      {"kv.max_session_tokens", options.kv.max_session_tokens},
      {"max_queued_rows_per_session", options.max_queued_rows_per_session},
      {"max_sessions", options.max_sessions}};
  for (const auto& [name, value] : positive) {
    if (value < 1)
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected >= 1, got ", value));
  }
  if (options.kv.prefault_ahead_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv.prefault_ahead_bytes: expected >= 0 (0 = none), got ",
                     options.kv.prefault_ahead_bytes));
  }
  if (options.idle_timeout_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("idle_timeout_us: expected >= 0 (0 = never), got ", options.idle_timeout_us));
  }
  if (options.gather_delay_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather_delay_us: expected >= 0 (0 = none), got ", options.gather_delay_us));
  }
  if (options.compute_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute_threads: expected >= 0, got ", options.compute_threads));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DecodeRuntime>> DecodeRuntime::Create(
    const DecodeRuntimeOptions& options, batching::Clock* clock, DecodeListener* listener,
    ComputeTeams* teams) {
  if (absl::Status s = ValidateDecodeRuntimeOptions(options); !s.ok()) return s;
  std::unique_ptr<DecodeRuntime> runtime(new DecodeRuntime(options, clock, listener, teams));
  runtime->thread_ = std::thread([r = runtime.get()] { r->Loop(); });
  return runtime;
}

DecodeRuntime::DecodeRuntime(const DecodeRuntimeOptions& options, batching::Clock* clock,
                             DecodeListener* listener, ComputeTeams* teams)
    : options_(options),
      clock_(clock),
      listener_(listener),
      budget_(options.kv),
      runner_(&budget_, options.compute_threads, clock, listener, teams),
      scheduler_(options.scheduling) {}

DecodeRuntime::~DecodeRuntime() { Drain(); }

absl::StatusOr<SessionId> DecodeRuntime::Open(SessionSpec spec, ReadyCallback ready) {
  if (spec.model == nullptr || spec.model->layer == nullptr) {
    return absl::InvalidArgumentError("model: expected a loaded model version, got none");
  }
  const int64_t d = spec.model->config.attention.d_model;
  if (spec.memory.size() % static_cast<size_t>(d) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory: expected a multiple of d_model (", d,
                                                   ") floats, got ", spec.memory.size()));
  }
  if (const int64_t bad = core::FindNonFinite(spec.memory); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory: value ", bad, " is not finite"));
  }
  auto session = std::make_shared<Session>();
  session->owner = spec.owner;
  session->model = std::move(spec.model);
  session->cross = !spec.memory.empty();
  session->d_model = d;
  session->memory = std::move(spec.memory);
  session->on_ready = std::move(ready);
  session->on_closed = std::move(spec.on_closed);
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) return absl::UnavailableError("decoding runtime is draining: no new sessions");
  if (static_cast<int64_t>(sessions_.size()) >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sessions: ", sessions_.size(), " open, the server's max_sessions is ",
                     options_.max_sessions, "; close sessions or retry later"));
  }
  session->id = next_id_++;
  session->last_active_us = clock_->NowMicros();
  sessions_.emplace(session->id, session);
  to_load_.push_back(session);
  WakeLocked();
  return session->id;
}

absl::Status DecodeRuntime::Append(StepRequest* request) {
  StepRequest* one[] = {request};
  return std::move(AppendAll(one).front());
}

std::vector<absl::Status> DecodeRuntime::AppendAll(std::span<StepRequest* const> requests) {
  std::vector<absl::Status> statuses(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) statuses[i] = CheckStep(requests[i]);
  std::lock_guard<std::mutex> lock(mu_);
  bool queued = false;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (statuses[i].ok()) statuses[i] = QueueLocked(requests[i]);
    queued |= statuses[i].ok();
  }
  if (queued) WakeLocked();  // Once, after all: the loop sees them together.
  return statuses;
}

absl::Status DecodeRuntime::CheckStep(const StepRequest* request) {
  if (request == nullptr || request->done == nullptr) {
    return absl::InvalidArgumentError("done: expected a callback, got none");
  }
  if (request->rows.empty()) {
    return absl::InvalidArgumentError("rows: expected at least one row, got none");
  }
  if (const int64_t bad = core::FindNonFinite(request->rows); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("rows: value ", bad, " is not finite"));
  }
  return absl::OkStatus();
}

absl::Status DecodeRuntime::QueueLocked(StepRequest* request) {
  if (draining_) return absl::UnavailableError("decoding runtime is draining: no new steps");
  auto it = sessions_.find(request->session);
  if (it == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("session: no open session ", request->session, " (closed, idle or unknown)"));
  }
  const std::shared_ptr<Session>& session = it->second;
  const model::Model& model = *session->model;
  if (!request->model.empty() && request->model != model.name) {
    return absl::FailedPreconditionError(absl::StrCat("model: session ", session->id, " runs on \"",
                                                      model.name, "\", got \"", request->model,
                                                      "\""));
  }
  if (request->model_version != 0 && request->model_version != model.version) {
    return absl::FailedPreconditionError(absl::StrCat("model_version: session ", session->id,
                                                      " runs on version ", model.version, ", got ",
                                                      request->model_version));
  }
  const int64_t d = session->d_model;
  const int64_t size = static_cast<int64_t>(request->rows.size());
  if (size % d != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows: expected a multiple of d_model (", d, ") floats, got ", size));
  }
  const int64_t rows = size / d;
  if (session->queued_rows + rows > options_.max_queued_rows_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", session->id, " has ", session->queued_rows,
        " rows queued; max_queued_rows_per_session is ", options_.max_queued_rows_per_session));
  }
  auto item = std::make_unique<StepItem>();
  item->session = session;
  item->rows = std::move(request->rows);
  item->num_rows = rows;
  item->output.resize(item->rows.size());
  item->accepted_us = clock_->NowMicros();
  item->done = std::move(request->done);
  request->done = nullptr;
  session->queued_rows += rows;
  session->last_active_us = item->accepted_us;
  ++steps_queued_;
  scheduler_.Add(session->id, std::move(item));
  return absl::OkStatus();
}

void DecodeRuntime::CloseLocked(const std::shared_ptr<Session>& session, CloseReason reason) {
  sessions_.erase(session->id);
  Closing closing{session, reason, scheduler_.RemoveKey(session->id)};
  steps_queued_ -= static_cast<int64_t>(closing.dropped.size());
  to_close_.push_back(std::move(closing));
  WakeLocked();
}

void DecodeRuntime::WakeLocked() {
  wake_.store(true, std::memory_order_relaxed);
  cv_.notify_all();
}

absl::Status DecodeRuntime::Close(SessionId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session: no open session ", id));
  }
  CloseLocked(std::shared_ptr<Session>(it->second), CloseReason::kClient);
  return absl::OkStatus();
}

int64_t DecodeRuntime::CloseOwner(OwnerKey owner) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Session>> owned;
  for (const auto& [id, session] : sessions_) {
    if (session->owner == owner) owned.push_back(session);
  }
  for (const auto& session : owned) CloseLocked(session, CloseReason::kOwnerGone);
  return static_cast<int64_t>(owned.size());
}

void DecodeRuntime::Pause() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!draining_) paused_ = true;
}

void DecodeRuntime::Resume() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = false;
  WakeLocked();
}

void DecodeRuntime::Drain() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    draining_ = true;
    paused_ = false;
    WakeLocked();
    stopped_cv_.wait(lock, [this] { return stopped_; });
  }
  std::call_once(joined_, [this] { thread_.join(); });
}

DecodeStats DecodeRuntime::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DecodeStats stats = totals_;
  stats.kv_bytes_used = budget_.used_bytes();
  stats.kv_bytes_capacity = budget_.capacity_bytes();
  stats.kv_bytes_touched = budget_.touched_bytes();
  stats.sessions_open = static_cast<int64_t>(sessions_.size());
  stats.steps_queued = steps_queued_;
  return stats;
}

std::map<std::pair<std::string, int64_t>, int64_t> DecodeRuntime::SessionsPerVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::pair<std::string, int64_t>, int64_t> counts;
  for (const auto& [id, session] : sessions_) {
    ++counts[{session->model->name, session->model->version}];
  }
  return counts;
}

bool DecodeRuntime::HasWorkLocked() const {
  return draining_ || !to_close_.empty() || !to_load_.empty() ||
         (!paused_ && !scheduler_.empty()) || NextIdleDeadlineLocked() <= clock_->NowMicros();
}

int64_t DecodeRuntime::NextIdleDeadlineLocked() const {
  int64_t deadline = batching::kNoDeadline;
  if (options_.idle_timeout_us == 0) return deadline;
  for (const auto& [id, session] : sessions_) {
    if (session->ready && session->queued_rows == 0) {
      deadline = std::min(deadline, session->last_active_us + options_.idle_timeout_us);
    }
  }
  return deadline;
}

void DecodeRuntime::GatherLocked(std::unique_lock<std::mutex>& lock) {
  if (options_.gather_delay_us == 0) return;
  const int64_t until = clock_->NowMicros() + options_.gather_delay_us;
  auto only_steps_short = [this] {
    return !draining_ && !paused_ && to_close_.empty() && to_load_.empty() && !scheduler_.empty() &&
           scheduler_.size() < expected_steps_;
  };
  while (only_steps_short() && clock_->NowMicros() < until) clock_->WaitUntil(cv_, lock, until);
}

void DecodeRuntime::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    while (!HasWorkLocked()) {
      // Idle: map the pages of the blocks the next growth will take, a slice at a time; work
      // arriving meanwhile stops the slice at its next page (wake_).
      if (budget_.PrefaultPending()) {
        wake_.store(false, std::memory_order_relaxed);
        lock.unlock();
        budget_.Prefault(kPrefaultSliceBytes, &wake_);
        lock.lock();
        continue;
      }
      clock_->WaitUntil(cv_, lock, NextIdleDeadlineLocked());
    }
    GatherLocked(lock);
    const int64_t now_us = clock_->NowMicros();
    if (options_.idle_timeout_us > 0) {
      std::vector<std::shared_ptr<Session>> idle;
      for (const auto& [id, session] : sessions_) {
        if (session->ready && session->queued_rows == 0 &&
            session->last_active_us + options_.idle_timeout_us <= now_us) {
          idle.push_back(session);
        }
      }
      for (const auto& session : idle) CloseLocked(session, CloseReason::kIdle);
    }
    // Drained: every accepted step was answered; end the sessions.
    const bool finishing = draining_ && scheduler_.empty() && to_load_.empty();
    if (finishing) {
      std::vector<std::shared_ptr<Session>> all;
      for (const auto& [id, session] : sessions_) all.push_back(session);
      for (const auto& session : all) CloseLocked(session, CloseReason::kDrained);
    }
    std::vector<Closing> closes = std::move(to_close_);
    to_close_.clear();
    std::vector<std::shared_ptr<Session>> loads, cancelled_loads;
    for (auto& session : to_load_) {
      (sessions_.contains(session->id) ? loads : cancelled_loads).push_back(std::move(session));
    }
    to_load_.clear();
    std::vector<StepScheduler::Slice> slices;
    if (!paused_) slices = scheduler_.NextIteration();
    lock.unlock();

    // Closes first, so their blocks serve this iteration.
    for (Closing& closing : closes) {
      Session& s = *closing.session;
      const std::string why =
          absl::StrCat("session ", s.id, " was closed (",
                       std::string(CloseReasonName(closing.reason)), ") before this step ran");
      for (auto& item : closing.dropped) {
        if (item->done == nullptr) continue;
        StepCallback done = std::move(item->done);
        item->done = nullptr;
        done(closing.reason == CloseReason::kDrained ? absl::UnavailableError(why)
                                                     : absl::CancelledError(why));
        if (listener_ != nullptr) {
          listener_->OnStepAnswered(clock_->NowMicros() - item->accepted_us,
                                    absl::CancelledError(why));
        }
      }
      if (s.pool != nullptr) {
        budget_.Detach(*s.model, s.cache);
        s.pool = nullptr;
      }
      const SessionId id = s.id;
      std::function<void(CloseReason)> on_closed = std::move(s.on_closed);
      // Let go of the session (and with it, perhaps, the last hold on its model version) before
      // anyone hears that it closed.
      closing.dropped.clear();
      closing.session.reset();
      // Before it is counted: whoever reads the count sees the owner told.
      if (on_closed != nullptr) on_closed(closing.reason);
      {
        // Counted before the listener hears of it, so a reader woken by it sees the count.
        std::lock_guard<std::mutex> count_lock(mu_);
        ++totals_.sessions_closed[static_cast<int>(closing.reason)];
      }
      if (listener_ != nullptr) listener_->OnSessionClosed(id, closing.reason);
    }
    for (auto& session : cancelled_loads) {
      if (session->on_ready) {
        session->on_ready(absl::CancelledError(
            absl::StrCat("session ", session->id, " was closed before it was ready")));
      }
    }
    std::vector<Session*> raw;
    for (auto& session : loads) raw.push_back(session.get());
    const std::vector<absl::Status> loaded = runner_.Load(raw);
    // Steps of sessions whose load failed. Kept to the end of the pass: one of them may be the
    // head of a prompt whose chunk is in `slices` (the runner then fails it without answering).
    std::vector<std::pair<absl::Status, std::vector<std::unique_ptr<StepItem>>>> failures;
    if (!loads.empty()) {
      // A session whose load failed is gone before anyone hears of it.
      lock.lock();
      const int64_t loaded_us = clock_->NowMicros();
      for (size_t i = 0; i < loads.size(); ++i) {
        Session& s = *loads[i];
        if (loaded[i].ok()) {
          s.ready = true;
          s.last_active_us = loaded_us;
        } else if (sessions_.erase(s.id) != 0) {  // Else closed meanwhile: steps dropped.
          auto dropped = scheduler_.RemoveKey(s.id);
          steps_queued_ -= static_cast<int64_t>(dropped.size());
          failures.emplace_back(loaded[i], std::move(dropped));
        }
      }
      lock.unlock();
      for (size_t i = 0; i < loads.size(); ++i) {
        if (loads[i]->on_ready) std::exchange(loads[i]->on_ready, nullptr)(loaded[i]);
      }
      for (auto& [status, items] : failures) {
        for (auto& item : items) {
          if (item->done != nullptr) std::exchange(item->done, nullptr)(status);
        }
      }
    }
    std::vector<SessionId> failed_unfinished;
    IterationReport report;
    if (!slices.empty()) report = runner_.Run(slices, &failed_unfinished);

    // Settle the books before answering, so that what a caller reads once answered is current.
    lock.lock();
    const int64_t done_us = clock_->NowMicros();
    auto account = [&](StepItem& item) {
      item.session->queued_rows -= item.num_rows;
      item.session->last_active_us = done_us;
      --steps_queued_;
    };
    const int64_t iteration = totals_.iterations;  // The number of the one that just ran.
    std::vector<SessionId> answered;
    for (StepScheduler::Slice& slice : slices) {
      if (slice.finished == nullptr) continue;
      account(*slice.finished);
      slice.finished->session->answered_iteration = iteration;
      answered.push_back(slice.finished->session->id);
    }
    std::vector<std::unique_ptr<StepItem>> removed;  // Alive until answered.
    for (SessionId key : failed_unfinished) {
      if (std::unique_ptr<StepItem> item = scheduler_.Remove(key)) {
        account(*item);
        removed.push_back(std::move(item));
      }
    }
    if (!slices.empty()) {
      ++totals_.iterations;
      totals_.prefill_tokens += report.prefill_tokens;
      totals_.decode_tokens += report.decode_tokens;
      expected_steps_ = static_cast<int64_t>(answered.size());
      for (SessionId id : answered_last_) {
        auto it = sessions_.find(id);
        if (it != sessions_.end() && it->second->answered_iteration != iteration) ++expected_steps_;
      }
      answered_last_ = std::move(answered);
      lock.unlock();
      runner_.AnswerAll(slices);
      slices.clear();
      removed.clear();
      lock.lock();
    }
    if (finishing) {
      stopped_ = true;
      stopped_cv_.notify_all();
      return;
    }
  }
}

}  // namespace attnserve::decoding
