// ModelRouter: which model, limits and batcher serve a request's model name.
//
// It owns the model repository and one batcher per model name (batching options: the server's
// defaults with the model's config.json overrides). After the repository changes (Sync), new
// models get a batcher and are warmed up, reloaded ones get their new options, and unloaded ones
// have their batcher drained, so every request accepted before an unload is still answered.
//
// Thread-safe: Route/Infos from any number of threads (the RPC handlers), Sync from one (the
// repository poller).
#ifndef ATTNSERVE_SERVER_MODEL_ROUTER_H_
#define ATTNSERVE_SERVER_MODEL_ROUTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "core/model/model_repository.h"
#include "server/attend_task.h"
#include "server/batch_runner.h"
#include "server/batching/batcher.h"
#include "server/batching/batching_options.h"
#include "server/conversion.h"

namespace attnserve::server {

using AttendBatcher = batching::Batcher<AttendTask>;

struct ModelRouterOptions {
  // Batching for models whose config.json sets no override.
  batching::BatchingOptions batching;
  // Longest query or memory sequence for models whose config.json sets none.
  int64_t max_sequence_length = 4096;
  // Largest answer a request may ask for (output plus weights), in bytes: the gRPC send limit.
  int64_t max_response_bytes = int64_t{64} << 20;
  // The model that answers requests naming none (""). Empty: the only serving model, or "demo"
  // when several serve and one is named so.
  std::string default_model;
};

// Everything a request for one model needs. Holds the batcher alive while in use.
struct ModelRoute {
  std::shared_ptr<const model::Model> model;
  RequestLimits limits;
  std::shared_ptr<AttendBatcher> batcher;
};

class ModelRouter {
 public:
  // Called with each model name whose serving state changed (true = serving).
  using ServingListener = std::function<void(const std::string& name, bool serving)>;

  // Creates batchers for every model `repository` serves, warming each up. `runner` and `clock`
  // are not owned and must outlive the router.
  ModelRouter(std::unique_ptr<model::ModelRepository> repository, BatchRunner* runner,
              const ModelRouterOptions& options, ServingListener listener = nullptr,
              batching::Clock* clock = batching::RealClock::Default());
  // Drains every batcher.
  ~ModelRouter();
  ModelRouter(const ModelRouter&) = delete;
  ModelRouter& operator=(const ModelRouter&) = delete;

  // The route for `name` ("" = the default model). NotFound naming the field `model`, the value
  // and the serving models; Unavailable when the model's last load failed and none serves.
  absl::StatusOr<ModelRoute> Route(std::string_view name) const;

  // ModelInfo-ready descriptions of every serving model, sorted by name.
  struct ModelDescription {
    std::shared_ptr<const model::Model> model;
    ModelLimits limits;
    bool is_default = false;
  };
  std::vector<ModelDescription> Describe() const;
  absl::StatusOr<ModelDescription> Describe(std::string_view name) const;
  // Requests waiting in each serving model's batcher.
  std::map<std::string, int64_t> QueueDepths() const;

  // Rescans the repository (ModelRepository::Poll) and applies what changed. Returns the events.
  std::vector<model::ModelEvent> Poll();
  // Brings the batchers in line with the repository's serving models (after someone else polled
  // or reloaded it): new models get a batcher after a warm-up pass, unloaded ones are drained.
  void Sync();

  // Drains every batcher: queued requests are computed and answered; new ones are refused.
  void DrainAll();

  model::ModelRepository& repository() { return *repository_; }
  // The name "" resolves to right now; empty when there is none.
  std::string DefaultModelName() const;

 private:
  struct Entry {
    std::shared_ptr<const model::Model> model;
    ModelLimits limits;
    std::shared_ptr<AttendBatcher> batcher;
  };

  ModelLimits LimitsFor(const model::Model& model) const;
  std::shared_ptr<AttendBatcher> MakeBatcher(const batching::BatchingOptions& options);
  std::string DefaultNameLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const Entry*> FindLocked(std::string_view name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<model::ModelRepository> repository_;
  BatchRunner* const runner_;
  const ModelRouterOptions options_;
  const ServingListener listener_;
  batching::Clock* const clock_;

  std::mutex sync_mu_;  // One Sync at a time.
  mutable std::shared_mutex mu_;
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_MODEL_ROUTER_H_
