#include "server/runtime/model_lifecycle.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "core/util/notification.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

// Runs a small request of `model` through `queue` and waits for it: oneDNN creates its kernels
// on first use (tens of ms), and the batch thread's executor builds its primitives, which would
// otherwise land on the first caller. A failure is logged; the model serves anyway.
void WarmUp(AttendQueue& queue, const std::shared_ptr<const model::Model>& model,
            const ModelLimits& limits) {
  const int64_t d = model->config.attention.d_model;
  const int64_t rows =
      std::min<int64_t>({16, limits.request.max_sequence_length, limits.batching.max_batch_tokens});
  AttendWork work;
  work.model = model;
  work.query.assign(static_cast<size_t>(rows * d), 0.5f);
  work.query_lengths = {rows};
  work.padded_query_length = rows;
  work.padded_memory_length = rows;
  work.warm_up = true;
  Notification done;
  absl::Status computed;  // Written by the batch thread before done.Notify().
  auto task =
      std::make_unique<AttendTask>(std::move(work), batching::kNoDeadline, nullptr,
                                   [&](const AttendWork&, absl::StatusOr<AttendResult> result) {
                                     computed = result.status();
                                     done.Notify();
                                   });
  // Its own variable: the answer may come (on a batch thread) before Schedule returns.
  absl::Status outcome = queue.Schedule(&task);
  if (outcome.ok()) {
    done.WaitForNotification();
    outcome = computed;
  } else {
    task->Release();
  }
  if (!outcome.ok()) {
    spdlog::warn("model {} v{}: warm-up failed: {}", model->name, model->version,
                 outcome.ToString());
  }
}

// Options that admit every task either `a` or `b` admits, with no batching delay: a reloaded
// model's queue holds them while the new version warms up and is published, so that neither
// version's requests are refused by the other's limits meanwhile.
batching::BatchingOptions AdmittingBoth(const batching::BatchingOptions& a,
                                        const batching::BatchingOptions& b) {
  const auto bytes = [](int64_t x, int64_t y) { return x == 0 || y == 0 ? 0 : std::max(x, y); };
  return {.max_batch_sequences = std::max(a.max_batch_sequences, b.max_batch_sequences),
          .max_batch_tokens = std::max(a.max_batch_tokens, b.max_batch_tokens),
          .max_queue_delay_us = 0,
          .max_queue_size = std::max(a.max_queue_size, b.max_queue_size),
          .max_queued_bytes = bytes(a.max_queued_bytes, b.max_queued_bytes)};
}

void SetOptions(AttendQueue& queue, const batching::BatchingOptions& options,
                const std::string& model) {
  // Model configs are validated on load, so this cannot fail; say so if it ever does.
  if (absl::Status updated = queue.UpdateOptions(options); !updated.ok()) {
    spdlog::error("model {}: batching options kept: {}", model, updated.ToString());
  }
}

// Names the repository knows that have no serving version, with why.
std::map<std::string, absl::Status, std::less<>> FailedModels(
    const std::vector<repository::ModelState>& states) {
  std::map<std::string, absl::Status, std::less<>> failed;
  for (const repository::ModelState& state : states) {
    if (state.serving == nullptr) failed.emplace(state.name, state.last_error);
  }
  return failed;
}

}  // namespace

ModelLifecycle::ModelLifecycle(std::unique_ptr<repository::ModelRepository> repository,
                               AttendScheduler* scheduler, BatchRunner* runner, ModelRouter* router,
                               const ModelLifecycleOptions& options,
                               ModelLifecycleListener listener)
    : repository_(std::move(repository)),
      scheduler_(scheduler),
      runner_(runner),
      router_(router),
      options_(options),
      listener_(std::move(listener)) {
  Sync();
}

ModelLifecycle::~ModelLifecycle() {
  DrainAll();
  router_->Publish({});  // The queues go with the lifecycle that made them.
}

void ModelLifecycle::StartPolling() {
  if (options_.poll_interval_ms <= 0) return;
  std::lock_guard<std::mutex> lock(poller_mu_);
  if (poller_ != nullptr) return;
  poller_ = std::make_unique<repository::RepositoryPoller>(
      *repository_,
      repository::RepositoryPollerOptions{.poll_interval_ms = options_.poll_interval_ms},
      [this](const std::vector<repository::ModelEvent>& events, const absl::Status& scan) {
        if (listener_.on_events) listener_.on_events(events, scan);
        if (!events.empty()) Sync();
      });
}

void ModelLifecycle::DrainAll() {
  {
    // Joins a poll in progress, and with it the Sync it triggered.
    std::lock_guard<std::mutex> lock(poller_mu_);
    poller_.reset();
  }
  std::vector<std::shared_ptr<AttendQueue>> queues;
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    drained_ = true;
    for (const auto& [name, route] : serving_) queues.push_back(route.queue);
  }
  for (auto& queue : queues) queue->Drain();
}

std::shared_ptr<AttendQueue> ModelLifecycle::MakeQueue(const batching::BatchingOptions& options) {
  BatchRunner* runner = runner_;
  absl::StatusOr<std::unique_ptr<AttendQueue>> queue = scheduler_->AddQueue(
      options, [runner](batching::Batch<AttendTask> batch) { runner->Run(std::move(batch)); },
      [](std::unique_ptr<AttendTask> task, absl::Status why) { task->Finish(std::move(why)); });
  // Limits are validated when the server starts and when a config.json loads.
  if (!queue.ok()) {
    spdlog::critical("batch queue refused validated options: {}", queue.status().ToString());
    std::abort();
  }
  return std::shared_ptr<AttendQueue>(*std::move(queue));
}

std::string ModelLifecycle::DefaultName(
    const std::map<std::string, ModelRoute, std::less<>>& serving) const {
  if (!options_.default_model.empty()) return options_.default_model;
  if (serving.size() == 1) return serving.begin()->first;
  if (serving.contains(model::kDemoModelName)) return model::kDemoModelName;
  return "";
}

void ModelLifecycle::Sync() {
  std::lock_guard<std::mutex> sync_lock(sync_mu_);
  if (drained_) return;
  const std::vector<std::shared_ptr<const model::Model>> models = repository_->ServingModels();
  const auto failed = FailedModels(repository_->States());

  // New names are announced as loading while they warm up: Unavailable (retry), not NotFound.
  RoutingTable table{
      .serving = serving_, .failed = failed, .loading = {}, .default_model = DefaultName(serving_)};
  for (const auto& model : models) {
    if (!serving_.contains(model->name)) table.loading.insert(model->name);
  }
  if (!table.loading.empty()) router_->Publish(table);

  // Every new version is warmed up through its queue before requests can reach it.
  std::map<std::string, ModelRoute, std::less<>> next;
  std::vector<std::pair<std::string, bool>> changes;
  for (const auto& model : models) {
    ModelRoute route{.model = model,
                     .limits = ApplyModelConfig(options_.default_limits, model->config),
                     .queue = nullptr};
    // The warm-up request must not wait out max_queue_delay_us: it runs with no delay (for a
    // reload, the old version's requests queued meanwhile are released early too).
    batching::BatchingOptions no_delay = route.limits.batching;
    no_delay.max_queue_delay_us = 0;
    auto serving = serving_.find(model->name);
    const bool changed = serving == serving_.end() || serving->second.model != model;
    if (serving == serving_.end()) {
      route.queue = MakeQueue(no_delay);
      changes.emplace_back(model->name, true);
    } else {
      route.queue = serving->second.queue;
      // Until the router publishes the new version, requests validated against the old one's
      // limits still arrive: the queue admits what either admits.
      if (changed) {
        SetOptions(*route.queue,
                   AdmittingBoth(serving->second.limits.batching, route.limits.batching),
                   model->name);
      }
    }
    if (changed) WarmUp(*route.queue, model, route.limits);
    next.emplace(model->name, std::move(route));
  }
  std::vector<std::shared_ptr<AttendQueue>> retired;
  for (auto& [name, route] : serving_) {
    if (!next.contains(name)) {
      retired.push_back(std::move(route.queue));
      changes.emplace_back(name, false);
    }
  }
  serving_ = std::move(next);
  router_->Publish({.serving = serving_,
                    .failed = failed,
                    .loading = {},
                    .default_model = DefaultName(serving_)});
  // Published: from now on requests are validated against the new versions' limits, and their
  // queues take them (a request validated just before may still be refused by a tighter limit).
  for (const auto& model : models) {
    const ModelRoute& route = serving_.at(model->name);
    SetOptions(*route.queue, route.limits.batching, model->name);
  }

  // Health first, so that load balancers stop sending to an unloaded model; then draining
  // computes whatever its queue still had.
  if (listener_.on_serving_changed) {
    for (const auto& [name, serving_now] : changes) listener_.on_serving_changed(name, serving_now);
  }
  for (auto& queue : retired) queue->Drain();
}

}  // namespace attnserve::server
