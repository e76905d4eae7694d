#include "server/model_router.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// A small request through the fresh model: oneDNN creates its kernels on first use (tens of ms),
// which would otherwise land on the first caller.
void WarmUp(BatchRunner& runner, const std::shared_ptr<const model::Model>& model) {
  const int64_t d = model->config.attention.d_model;
  AttendWork work;
  work.model = model;
  work.query.assign(static_cast<size_t>(16 * d), 0.5f);
  work.query_lengths = {16};
  work.padded_query_length = 16;
  work.padded_memory_length = 16;
  absl::StatusOr<AttendResult> result = runner.RunOne(work);
  if (!result.ok()) {
    spdlog::warn("warm-up of model {} version {} failed: {}", model->name, model->version,
                 result.status().ToString());
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
  absl::MutexLock sync_lock(&sync_mu_);
  std::vector<std::shared_ptr<const model::Model>> serving = repository_->ServingModels();
  std::vector<std::shared_ptr<AttendBatcher>> retired;
  std::vector<std::pair<std::string, bool>> changes;
  // Warm new versions up before they take traffic.
  for (const auto& model : serving) {
    bool known_version;
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = entries_.find(model->name);
      known_version = it != entries_.end() && it->second.model == model;
    }
    if (!known_version) WarmUp(*runner_, model);
  }
  {
    absl::MutexLock lock(&mu_);
    std::map<std::string, Entry, std::less<>> next;
    for (const auto& model : serving) {
      Entry entry{.model = model, .limits = LimitsFor(*model), .batcher = nullptr};
      const batching::BatchingOptions options =
          ToBatchingOptions(entry.limits, options_.batching.num_batch_threads);
      auto it = entries_.find(model->name);
      if (it != entries_.end()) {
        entry.batcher = std::move(it->second.batcher);
        // Model configs are validated on load, so this cannot fail; say so if it ever does.
        if (absl::Status updated = entry.batcher->UpdateOptions(options); !updated.ok()) {
          spdlog::error("model {}: batching options kept: {}", model->name, updated.ToString());
        }
        entries_.erase(it);
      } else {
        entry.batcher = MakeBatcher(options);
        changes.emplace_back(model->name, true);
      }
      next.emplace(model->name, std::move(entry));
    }
    for (auto& [name, entry] : entries_) {
      retired.push_back(std::move(entry.batcher));
      changes.emplace_back(name, false);
    }
    entries_ = std::move(next);
  }
  // Outside the lock: draining computes whatever the unloaded models still had queued.
  for (auto& batcher : retired) batcher->Drain();
  if (listener_) {
    for (const auto& [name, serving_now] : changes) listener_(name, serving_now);
  }
}

void ModelRouter::DrainAll() {
  std::vector<std::shared_ptr<AttendBatcher>> batchers;
  {
    absl::ReaderMutexLock lock(&mu_);
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
  absl::ReaderMutexLock lock(&mu_);
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
  absl::ReaderMutexLock lock(&mu_);
  absl::StatusOr<const Entry*> entry = FindLocked(name);
  if (!entry.ok()) return entry.status();
  return ModelRoute{
      .model = (*entry)->model, .limits = (*entry)->limits.request, .batcher = (*entry)->batcher};
}

std::vector<ModelRouter::ModelDescription> ModelRouter::Describe() const {
  absl::ReaderMutexLock lock(&mu_);
  const std::string default_name = DefaultNameLocked();
  std::vector<ModelDescription> out;
  for (const auto& [name, entry] : entries_) {
    out.push_back(
        {.model = entry.model, .limits = entry.limits, .is_default = name == default_name});
  }
  return out;
}

absl::StatusOr<ModelRouter::ModelDescription> ModelRouter::Describe(std::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  absl::StatusOr<const Entry*> entry = FindLocked(name);
  if (!entry.ok()) return entry.status();
  return ModelDescription{.model = (*entry)->model,
                          .limits = (*entry)->limits,
                          .is_default = (*entry)->model->name == DefaultNameLocked()};
}

}  // namespace attnserve::server
