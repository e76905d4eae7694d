// ModelLifecycle: the life of every served model, from its folder to its last request.
//
// It owns the model repository and is the one place that polls it. After every change it brings
// the serving models in line: a new model gets a batch queue on the shared scheduler and is
// warmed up before requests can reach it; a reloaded one gets its new limits and is warmed up
// before it replaces the old version; an unloaded one leaves the routing table first, then its
// queue is drained, so every request accepted before the unload is still answered. It picks the
// default model and publishes the result to the ModelRouter.
//
// Thread-safe: StartPolling/DrainAll/States from any thread; syncs (the constructor's, then the
// poller thread's) run one at a time.
#ifndef ATTNSERVE_SERVER_RUNTIME_MODEL_LIFECYCLE_H_
#define ATTNSERVE_SERVER_RUNTIME_MODEL_LIFECYCLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/repository/model_repository.h"
#include "server/repository/repository_poller.h"
#include "server/runtime/batch_runner.h"
#include "server/runtime/model_limits.h"
#include "server/runtime/model_router.h"

namespace attnserve::server {

struct ModelLifecycleOptions {
  // Limits of models whose config.json sets none.
  ModelLimits default_limits;
  // The model that answers requests naming none (""). Empty: the only serving model, or "demo"
  // when several serve and one is named so.
  std::string default_model;
  // Milliseconds between repository scans for added, changed or removed model folders, once
  // StartPolling is called; 0 = never (models load once).
  int64_t poll_interval_ms = 0;
};

// What the lifecycle tells the rest of the server; each callback may be empty. Called on the
// thread that syncs (the constructor's, or the poller's), one sync at a time; a callback must not
// call back into the lifecycle.
struct ModelLifecycleListener {
  // After each poll that changed something, or whose repository scan status changed (`scan`:
  // OK, or why the repository folder could not be listed), for logs and metrics.
  std::function<void(const std::vector<repository::ModelEvent>& events, const absl::Status& scan)>
      on_events;
  // A model name started (true) or stopped (false) serving (for health).
  std::function<void(const std::string& name, bool serving)> on_serving_changed;
};

class ModelLifecycle {
 public:
  // Publishes every model `repository` serves to `router`, each with a warmed-up queue on
  // `scheduler` whose batches `runner` executes. `scheduler`, `runner` and `router` are not
  // owned and must outlive the lifecycle.
  ModelLifecycle(std::unique_ptr<repository::ModelRepository> repository,
                 AttendScheduler* scheduler, BatchRunner* runner, ModelRouter* router,
                 const ModelLifecycleOptions& options, ModelLifecycleListener listener = {});
  // Stops polling, drains every queue and withdraws the routes (the router's table is emptied).
  ~ModelLifecycle();
  ModelLifecycle(const ModelLifecycle&) = delete;
  ModelLifecycle& operator=(const ModelLifecycle&) = delete;

  // Starts the repository poller (no-op when poll_interval_ms is 0 or it already runs).
  void StartPolling();
  // Stops polling, then drains every queue: queued requests are computed and answered, new ones
  // are refused (Unavailable). Idempotent.
  void DrainAll();

  // Every model name the repository knows, serving or failed, sorted.
  std::vector<repository::ModelState> States() const { return repository_->States(); }

 private:
  // Brings the queues and the routing table in line with the repository's serving models.
  void Sync();
  // The default model's name for this set of serving models.
  std::string DefaultName(const std::map<std::string, ModelRoute, std::less<>>& serving) const;
  std::shared_ptr<AttendQueue> MakeQueue(const batching::BatchingOptions& options);

  const std::unique_ptr<repository::ModelRepository> repository_;
  AttendScheduler* const scheduler_;
  BatchRunner* const runner_;
  ModelRouter* const router_;
  const ModelLifecycleOptions options_;
  const ModelLifecycleListener listener_;

  std::mutex sync_mu_;  // One Sync (and one drain) at a time.
  // What serves now, as last published.
  std::map<std::string, ModelRoute, std::less<>> serving_ ABSL_GUARDED_BY(sync_mu_);
  bool drained_ ABSL_GUARDED_BY(sync_mu_) = false;
  std::mutex poller_mu_;
  std::unique_ptr<repository::RepositoryPoller> poller_ ABSL_GUARDED_BY(poller_mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_MODEL_LIFECYCLE_H_
