#include "server/decoding/iteration_runner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/forward/finite_values.h"

namespace attnserve::decoding {
namespace {

absl::Status WithSession(SessionId id, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("session ", id, ": ", status.message()));
}

}  // namespace

IterationRunner::IterationRunner(KvBudget* budget, int compute_threads, batching::Clock* clock,
                                 DecodeListener* listener, ComputeTeams* teams)
    : budget_(budget),
      clock_(clock),
      listener_(listener),
      teams_(teams),
      compute_threads_(compute_threads) {}

IterationRunner::Team::Team(IterationRunner& runner)
    : teams_(runner.teams_),
      threads_(teams_ == nullptr ? runner.compute_threads_
                                 : teams_->Acquire(runner.compute_threads_ > 0
                                                       ? runner.compute_threads_
                                                       : std::numeric_limits<int>::max())) {
  std::vector<std::unique_ptr<core::CachedAttentionExecutor>>& executors = runner.executors_;
  if (executors.size() <= static_cast<size_t>(threads_)) executors.resize(threads_ + 1);
  std::unique_ptr<core::CachedAttentionExecutor>& executor = executors[threads_];
  if (executor == nullptr) {
    executor = std::make_unique<core::CachedAttentionExecutor>(
        core::ExecutorOptions{.compute_threads = threads_});
  }
  executor_ = executor.get();
}

IterationRunner::Team::~Team() {
  if (teams_ != nullptr) teams_->Release(threads_);
}

std::vector<absl::Status> IterationRunner::Load(std::span<Session* const> sessions) {
  std::vector<absl::Status> statuses(sessions.size());
  std::map<const model::Model*, std::vector<size_t>> groups;
  int64_t pending = 0;
  for (size_t i = 0; i < sessions.size(); ++i) {
    Session& s = *sessions[i];
    absl::StatusOr<core::KvBlockPool*> pool = budget_->Attach(*s.model);
    if (!pool.ok()) {
      statuses[i] = WithSession(s.id, pool.status());
      continue;
    }
    s.pool = *pool;
    if (!s.cross) continue;
    const int64_t rows = static_cast<int64_t>(s.memory.size()) / s.d_model;
    statuses[i] = budget_->Admit(*s.pool, s.cache, rows, &pending);
    if (statuses[i].ok()) {
      groups[s.model.get()].push_back(i);
    } else {
      statuses[i] = WithSession(s.id, statuses[i]);
    }
  }
  for (const auto& [model, members] : groups) {
    std::vector<Session*> group;
    for (size_t i : members) group.push_back(sessions[i]);
    absl::Status status = LoadTogether(group);
    for (size_t i : members) {
      if (!status.ok() && members.size() > 1) {
        Session* alone[] = {sessions[i]};
        statuses[i] = LoadTogether(alone);
      } else {
        statuses[i] = status;
      }
      if (!statuses[i].ok()) statuses[i] = WithSession(sessions[i]->id, statuses[i]);
    }
  }
  for (size_t i = 0; i < sessions.size(); ++i) {
    Session& s = *sessions[i];
    s.memory = {};
    s.memory.shrink_to_fit();
    if (!statuses[i].ok() && s.pool != nullptr) {
      budget_->Detach(*s.model, s.cache);
      s.pool = nullptr;
    }
  }
  budget_->Refresh();
  return statuses;
}

absl::Status IterationRunner::LoadTogether(std::span<Session* const> sessions) {
  std::vector<float> memory;
  std::vector<int64_t> offsets{0};
  std::vector<core::KvSequence*> caches;
  for (Session* s : sessions) {
    memory.insert(memory.end(), s->memory.begin(), s->memory.end());
    offsets.push_back(offsets.back() + static_cast<int64_t>(s->memory.size()) / s->d_model);
    caches.push_back(&s->cache);
  }
  const Session& first = *sessions.front();
  Team team(*this);
  return team.executor().LoadMemory(*first.model->layer, *first.pool,
                                    core::RaggedBatch{memory, offsets}, caches);
}

absl::Status IterationRunner::Validate(const StepScheduler::Slice& slice, int64_t* pending_bytes) {
  const StepItem& item = *slice.item;
  const Session& s = *item.session;
  if (s.pool == nullptr) {
    return absl::FailedPreconditionError(
        "the session has no cache (it is closed, or its memory failed to load)");
  }
  if (static_cast<int64_t>(item.rows.size()) != item.num_rows * s.d_model) {
    return absl::InvalidArgumentError(absl::StrCat("rows: expected ", item.num_rows, " x ",
                                                   s.d_model, " (d_model) floats, got ",
                                                   item.rows.size()));
  }
  const std::span<const float> rows(item.rows.data() + slice.begin * s.d_model,
                                    slice.count * s.d_model);
  if (const int64_t bad = core::FindNonFinite(rows); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows: value ", slice.begin * s.d_model + bad, " is not finite"));
  }
  if (s.cross) return absl::OkStatus();  // Cross-attention steps do not grow the cache.
  if (slice.begin == 0 && slice.count < item.num_rows) {
    // A prompt taken in chunks must fit whole (the session's cap, the budget as it stands now)
    // before its first chunk is computed: otherwise it would be computed up to the point where it
    // stops fitting, and then rolled back.
    int64_t whole = *pending_bytes;
    if (absl::Status status = budget_->Admit(*s.pool, s.cache, item.num_rows, &whole);
        !status.ok()) {
      return status;
    }
  }
  return budget_->Admit(*s.pool, s.cache, slice.count, pending_bytes);
}

absl::Status IterationRunner::Forward(std::span<StepScheduler::Slice* const> slices) {
  const Session& first = *slices.front()->item->session;
  const int64_t d = first.d_model;
  query_.clear();
  std::vector<int64_t> offsets{0};
  std::vector<core::KvSequence*> caches;
  for (const StepScheduler::Slice* slice : slices) {
    const StepItem& item = *slice->item;
    const auto begin = item.rows.begin() + slice->begin * d;
    query_.insert(query_.end(), begin, begin + slice->count * d);
    offsets.push_back(offsets.back() + slice->count);
    caches.push_back(&item.session->cache);
  }
  output_.resize(query_.size());
  const core::CachedAttentionInputs in{.query = {query_, offsets},
                                       .caches = caches,
                                       .cross_attention = first.cross,
                                       .mask = {.causal = !first.cross}};
  absl::Status status;
  {
    Team team(*this);
    status = team.executor().Forward(*first.model->layer, *first.pool, in, {.output = output_});
  }
  if (!status.ok()) return status;
  for (size_t i = 0; i < slices.size(); ++i) {
    StepItem& item = *slices[i]->item;
    std::copy(output_.begin() + offsets[i] * d, output_.begin() + offsets[i + 1] * d,
              item.output.begin() + slices[i]->begin * d);
  }
  return absl::OkStatus();
}

IterationReport IterationRunner::Run(std::vector<StepScheduler::Slice>& slices,
                                     std::vector<SessionId>* failed_unfinished) {
  const int64_t start_us = clock_->NowMicros();
  IterationReport report;
  report.slices = static_cast<int64_t>(slices.size());
  std::vector<absl::Status> statuses(slices.size());
  std::map<std::pair<const model::Model*, bool>, std::vector<size_t>> groups;
  int64_t pending = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    StepScheduler::Slice& slice = slices[i];
    statuses[i] = Validate(slice, &pending);
    if (!statuses[i].ok()) continue;
    const Session& s = *slice.item->session;
    if (slice.begin == 0) slice.item->start_length = s.cache.length;
    groups[{s.model.get(), s.cross}].push_back(i);
  }
  for (const auto& [key, members] : groups) {
    std::vector<StepScheduler::Slice*> group;
    for (size_t i : members) group.push_back(&slices[i]);
    ++report.forwards;
    const absl::Status status = Forward(group);
    for (size_t i : members) {
      if (status.ok() || members.size() == 1) {
        statuses[i] = status;
      } else {
        StepScheduler::Slice* alone[] = {&slices[i]};
        ++report.forwards;
        statuses[i] = Forward(alone);
      }
    }
  }
  report.compute_us = clock_->NowMicros() - start_us;
  // Roll back failed items first, so the budget is current before anyone is answered.
  for (size_t i = 0; i < slices.size(); ++i) {
    const StepScheduler::Slice& slice = slices[i];
    Session& s = *slice.item->session;
    if (!statuses[i].ok() && slice.begin > 0 && s.pool != nullptr && !s.cross) {
      // Earlier chunks of this item were committed: undo them, a step is all or nothing.
      s.pool->Commit(s.cache, slice.item->start_length);
      s.pool->Trim(s.cache);
    }
  }
  budget_->Refresh();
  for (size_t i = 0; i < slices.size(); ++i) {
    const StepScheduler::Slice& slice = slices[i];
    if (!statuses[i].ok()) {
      ++report.failed;
      if (slice.finished == nullptr) failed_unfinished->push_back(slice.key);
    } else {
      (slice.decode() ? report.decode_tokens : report.prefill_tokens) += slice.count;
    }
  }
  statuses_ = std::move(statuses);
  if (listener_ != nullptr) listener_->OnIteration(report);
  return report;
}

void IterationRunner::AnswerAll(std::vector<StepScheduler::Slice>& slices) {
  for (size_t i = 0; i < slices.size() && i < statuses_.size(); ++i) {
    StepScheduler::Slice& slice = slices[i];
    StepItem& item = *slice.item;
    if (!statuses_[i].ok()) {
      Answer(item, WithSession(item.session->id, statuses_[i]));
    } else if (slice.finished != nullptr) {
      Answer(item, std::move(item.output));
    }
  }
  statuses_.clear();
}

void IterationRunner::Answer(StepItem& item, absl::StatusOr<std::vector<float>> result) {
  if (item.done == nullptr) return;
  const bool ok = result.ok();
  const absl::Status status = ok ? absl::OkStatus() : result.status();
  StepCallback done = std::move(item.done);
  item.done = nullptr;
  done(std::move(result));
  if (listener_ != nullptr)
    listener_->OnStepAnswered(clock_->NowMicros() - item.accepted_us, status);
  (void)ok;
}

}  // namespace attnserve::decoding
