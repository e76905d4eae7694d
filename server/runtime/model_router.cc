#include "server/runtime/model_router.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/echo.h"

namespace attnserve::server {
namespace {

std::string ServingNames(const RoutingTable& table) {
  std::vector<std::string> names;
  for (const auto& [name, route] : table.serving) names.push_back(name);
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

absl::StatusOr<ModelRoute> Find(const RoutingTable& table, std::string_view name) {
  const std::string wanted = name.empty() ? table.default_model : std::string(name);
  if (wanted.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "model: no default model (several serve and none is named \"demo\"; start the server "
        "with --default-model); expected one of [",
        ServingNames(table), "], got \"\""));
  }
  if (auto it = table.serving.find(wanted); it != table.serving.end()) {
    ModelRoute route = it->second;
    route.is_default = wanted == table.default_model;
    return route;
  }
  if (table.loading.contains(wanted)) {
    return absl::UnavailableError(
        absl::StrCat("model: \"", EchoForMessage(wanted), "\" is loading; retry in a moment"));
  }
  if (auto it = table.failed.find(wanted); it != table.failed.end()) {
    return absl::UnavailableError(absl::StrCat("model: model \"", EchoForMessage(wanted),
                                               "\" failed to load: ", it->second.message()));
  }
  return absl::NotFoundError(absl::StrCat("model: model \"", EchoForMessage(wanted),
                                          "\" not found; serving: ", ServingNames(table)));
}

}  // namespace

void ModelRouter::Publish(RoutingTable table) {
  std::lock_guard<std::shared_mutex> lock(mu_);
  table_ = std::move(table);
}

absl::StatusOr<ModelRoute> ModelRouter::Route(std::string_view name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Find(table_, name);
}

std::vector<ModelRoute> ModelRouter::Routes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<ModelRoute> routes;
  for (const auto& [name, route] : table_.serving) {
    routes.push_back(route);
    routes.back().is_default = name == table_.default_model;
  }
  return routes;
}

std::string ModelRouter::DefaultModelName() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return table_.default_model;
}

std::map<std::string, int64_t> ModelRouter::QueueDepths() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::map<std::string, int64_t> depths;
  for (const auto& [name, route] : table_.serving) depths[name] = route.queue->QueueSize();
  return depths;
}

}  // namespace attnserve::server
