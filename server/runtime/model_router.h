// ModelRouter: which model version, limits and batch queue answer a request's model name.
//
// A read-mostly table: ModelLifecycle builds it after every change to the serving models and
// publishes it whole (Publish); request handlers look names up in it (Route, Routes). Routing
// decides nothing about loading, warming up or draining; that is the lifecycle's.
//
// Thread-safe: any number of readers, concurrently with Publish.
#ifndef ATTNSERVE_SERVER_RUNTIME_MODEL_ROUTER_H_
#define ATTNSERVE_SERVER_RUNTIME_MODEL_ROUTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/model.h"
#include "server/batching/shared_batch_scheduler.h"
#include "server/runtime/attend_task.h"
#include "server/runtime/model_limits.h"

namespace attnserve::server {

using AttendQueue = batching::BatchQueue<AttendTask>;
using AttendScheduler = batching::SharedBatchScheduler<AttendTask>;

// Everything a request for one model needs. Holds the queue alive while in use.
struct ModelRoute {
  std::shared_ptr<const model::Model> model;
  ModelLimits limits;
  std::shared_ptr<AttendQueue> queue;
  bool is_default = false;  // Whether it answers requests naming no model ("").
};

// What the router answers from: one published state of the serving models.
struct RoutingTable {
  // Serving models by name (is_default is filled in by lookups).
  std::map<std::string, ModelRoute, std::less<>> serving;
  // Names known but not serving: why not (the last load error), for a clear answer.
  std::map<std::string, absl::Status, std::less<>> failed;
  // Names that have loaded and are warming up: answered Unavailable, retry shortly.
  std::set<std::string, std::less<>> loading;
  // The name "" resolves to; empty when there is none.
  std::string default_model;
};

class ModelRouter {
 public:
  ModelRouter() = default;
  ModelRouter(const ModelRouter&) = delete;
  ModelRouter& operator=(const ModelRouter&) = delete;

  // Replaces the table; lookups from now on see the new one.
  void Publish(RoutingTable table);

  // The route for `name` ("" = the default model). NotFound naming the field `model`, the value
  // and the serving models; Unavailable when the model's last load failed and none serves, or
  // while it warms up.
  absl::StatusOr<ModelRoute> Route(std::string_view name) const;
  // Every serving model's route, sorted by name.
  std::vector<ModelRoute> Routes() const;
  // The name "" resolves to right now; empty when there is none.
  std::string DefaultModelName() const;
  // Tasks waiting in each serving model's queue.
  std::map<std::string, int64_t> QueueDepths() const;

 private:
  mutable std::shared_mutex mu_;
  RoutingTable table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_MODEL_ROUTER_H_
