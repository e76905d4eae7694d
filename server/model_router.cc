#include "server/model_router.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/notification.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

batching::BatchingOptions WithOverrides(batching::BatchingOptions options,
                                        const model::BatchingOverrides& overrides) {
  if (overrides.max_batch_sequences) options.max_batch_sequences = *overrides.max_batch_sequences;
  if (overrides.max_batch_tokens) options.max_batch_tokens = *overrides.max_batch_tokens;
  if (overrides.max_queue_delay_us) options.max_queue_delay_us = *overrides.max_queue_delay_us;
  if (overrides.max_queue_size) options.max_queue_size = *overrides.max_queue_size;
  return options;
}

batching::BatchingOptions ToBatchingOptions(const ModelLimits& limits, int num_batch_threads) {
  return {.max_batch_sequences = limits.request.max_batch_sequences,
          .max_batch_tokens = limits.request.max_batch_tokens,
          .max_queue_delay_us = limits.max_queue_delay_us,
          .max_queue_size = limits.max_queue_size,
          .num_batch_threads = num_batch_threads};
}

// Runs a small request of `model` through `batcher` and waits for it: oneDNN creates its kernels
// on first use (tens of ms), and the batch thread's executor builds its primitives, which would
// otherwise land on the first caller. A failure is logged; the model serves anyway.
void WarmUp(AttendBatcher& batcher, const std::shared_ptr<const model::Model>& model,
            const ModelLimits& limits) {
  const int64_t d = model->config.attention.d_model;
  const int64_t rows =
      std::min<int64_t>({16, limits.request.max_sequence_length, limits.request.max_batch_tokens});
  AttendWork work;
  work.model = model;
  work.query.assign(static_cast<size_t>(rows * d), 0.5f);
  work.query_lengths = {rows};
  work.padded_query_length = rows;
  work.padded_memory_length = rows;
  work.warm_up = true;
  Notification done;
  absl::Status outcome;
  auto task =
      std::make_unique<AttendTask>(std::move(work), batching::kNoDeadline, nullptr,
                                   [&](const AttendWork&, absl::StatusOr<AttendResult> result) {
                                     outcome = result.status();
                                     done.Notify();
                                   });
  outcome = batcher.Schedule(&task);
  if (outcome.ok()) {
    done.WaitForNotification();
  } else {
    task->Release();
  }
  if (!outcome.ok()) {
    spdlog::warn("model {} v{}: warm-up failed: {}", model->name, model->version,
                 outcome.ToString());
  }
}

void SetOptions(AttendBatcher& batcher, const batching::BatchingOptions& options,
                const std::string& model) {
  // Model configs are validated on load, so this cannot fail; say so if it ever does.
  if (absl::Status updated = batcher.UpdateOptions(options); !updated.ok()) {
    spdlog::error("model {}: batching options kept: {}", model, updated.ToString());
  }
}

}  // namespace

ModelRouter::ModelRouter(std::unique_ptr<model::ModelRepository> repository, BatchRunner* runner,
                         const ModelRouterOptions& options, ServingListener listener,
                         batching::Clock* clock)
    : repository_(std::move(repository)),
      runner_(runner),
      options_(options),
      listener_(std::move(listener)),
      clock_(clock) {
  Sync();
}

ModelRouter::~ModelRouter() { DrainAll(); }

ModelLimits ModelRouter::LimitsFor(const model::Model& model) const {
  const batching::BatchingOptions batching =
      WithOverrides(options_.batching, model.config.batching);
  return {.request = {.max_sequence_length =
                          model.config.max_sequence_length.value_or(options_.max_sequence_length),
                      .max_batch_sequences = batching.max_batch_sequences,
                      .max_batch_tokens = batching.max_batch_tokens,
                      .max_response_bytes = options_.max_response_bytes},
          .max_queue_delay_us = batching.max_queue_delay_us,
          .max_queue_size = batching.max_queue_size};
}

std::shared_ptr<AttendBatcher> ModelRouter::MakeBatcher(const batching::BatchingOptions& options) {
  BatchRunner* runner = runner_;
  return std::make_shared<AttendBatcher>(
      options, [runner](AttendBatcher::Batch batch) { runner->Run(std::move(batch)); },
      [](std::unique_ptr<AttendTask> task, absl::Status why) { task->Finish(std::move(why)); },
      clock_);
}

std::vector<model::ModelEvent> ModelRouter::Poll() {
  std::vector<model::ModelEvent> events = repository_->Poll();
  if (!events.empty()) Sync();
  return events;
}

void ModelRouter::Sync() {
  std::lock_guard<std::mutex> sync_lock(sync_mu_);
  // Work out the next entries outside mu_: new models get a batcher, and every new version is
  // warmed up through its batcher before requests can reach it.
  std::map<std::string, Entry, std::less<>> next;
  std::vector<std::pair<std::string, bool>> changes;
  for (const auto& model : repository_->ServingModels()) {
    Entry entry{.model = model, .limits = LimitsFor(*model), .batcher = nullptr};
    const batching::BatchingOptions options =
        ToBatchingOptions(entry.limits, options_.batching.num_batch_threads);
    std::shared_ptr<const model::Model> serving;
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (auto it = entries_.find(model->name); it != entries_.end()) {
        entry.batcher = it->second.batcher;
        serving = it->second.model;
      }
    }
    // The warm-up request must not wait out max_queue_delay_us: it runs with no delay (for a
    // reload, the old version's requests queued meanwhile are released early too).
    batching::BatchingOptions no_delay = options;
    no_delay.max_queue_delay_us = 0;
    if (entry.batcher == nullptr) {
      entry.batcher = MakeBatcher(no_delay);
      changes.emplace_back(model->name, true);
    } else if (serving != model) {
      SetOptions(*entry.batcher, no_delay, model->name);
    }
    if (serving != model) WarmUp(*entry.batcher, model, entry.limits);
    SetOptions(*entry.batcher, options, model->name);
    next.emplace(model->name, std::move(entry));
  }
  std::vector<std::shared_ptr<AttendBatcher>> retired;
  {
    std::lock_guard<std::shared_mutex> lock(mu_);
    for (auto& [name, entry] : entries_) {
      if (!next.contains(name)) {
        retired.push_back(std::move(entry.batcher));
        changes.emplace_back(name, false);
      }
    }
    entries_ = std::move(next);
  }
  // Health first, so that load balancers stop sending to an unloaded model; then, outside the
  // lock, draining computes whatever it still had queued.
  if (listener_) {
    for (const auto& [name, serving_now] : changes) listener_(name, serving_now);
  }
  for (auto& batcher : retired) batcher->Drain();
}

void ModelRouter::DrainAll() {
  std::vector<std::shared_ptr<AttendBatcher>> batchers;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    for (const auto& [name, entry] : entries_) batchers.push_back(entry.batcher);
  }
  for (auto& batcher : batchers) batcher->Drain();
}

std::string ModelRouter::DefaultNameLocked() const {
  if (!options_.default_model.empty()) return options_.default_model;
  if (entries_.size() == 1) return entries_.begin()->first;
  if (entries_.contains(model::kDemoModelName)) return model::kDemoModelName;
  return "";
}

std::string ModelRouter::DefaultModelName() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return DefaultNameLocked();
}

absl::StatusOr<const ModelRouter::Entry*> ModelRouter::FindLocked(std::string_view name) const {
  std::string wanted(name);
  if (wanted.empty()) {
    wanted = DefaultNameLocked();
    if (wanted.empty()) {
      std::vector<std::string> names;
      for (const auto& [serving_name, entry] : entries_) names.push_back(serving_name);
      return absl::NotFoundError(absl::StrCat(
          "model: no default model (several serve and none is named \"demo\"; start the server "
          "with --default-model); expected one of [",
          absl::StrJoin(names, ", "), "], got \"\""));
    }
  }
  auto it = entries_.find(wanted);
  if (it != entries_.end()) return &it->second;
  absl::StatusOr<std::shared_ptr<const model::Model>> found = repository_->Get(wanted);
  if (!found.ok()) {
    return absl::Status(found.status().code(), absl::StrCat("model: ", found.status().message()));
  }
  // Loaded a moment ago, not yet synced into a batcher.
  return absl::UnavailableError(
      absl::StrCat("model: \"", wanted, "\" is loading; retry in a moment"));
}

absl::StatusOr<ModelRoute> ModelRouter::Route(std::string_view name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  absl::StatusOr<const Entry*> entry = FindLocked(name);
  if (!entry.ok()) return entry.status();
  return ModelRoute{
      .model = (*entry)->model, .limits = (*entry)->limits.request, .batcher = (*entry)->batcher};
}

std::vector<ModelRouter::ModelDescription> ModelRouter::Describe() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const std::string default_name = DefaultNameLocked();
  std::vector<ModelDescription> out;
  for (const auto& [name, entry] : entries_) {
    out.push_back(
        {.model = entry.model, .limits = entry.limits, .is_default = name == default_name});
  }
  return out;
}

std::map<std::string, int64_t> ModelRouter::QueueDepths() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::map<std::string, int64_t> depths;
  for (const auto& [name, entry] : entries_) depths[name] = entry.batcher->QueueSize();
  return depths;
}

absl::StatusOr<ModelRouter::ModelDescription> ModelRouter::Describe(std::string_view name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  absl::StatusOr<const Entry*> entry = FindLocked(name);
  if (!entry.ok()) return entry.status();
  return ModelDescription{.model = (*entry)->model,
                          .limits = (*entry)->limits,
                          .is_default = (*entry)->model->name == DefaultNameLocked()};
}

}  // namespace attnserve::server
