// ModelRouter: lookups answer from the last published table — the route of a serving model, the
// default model for "", and a clear status for failed, loading and unknown names.
#include "server/runtime/model_router.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelRoute RouteOf(const std::string& name, int64_t max_sequence_length) {
  auto model = std::make_shared<model::Model>();
  model->name = name;
  ModelRoute route;
  route.model = model;
  route.limits.request.max_sequence_length = max_sequence_length;
  return route;
}

RoutingTable Table() {
  RoutingTable table;
  table.serving.emplace("a", RouteOf("a", 10));
  table.serving.emplace("demo", RouteOf("demo", 20));
  table.failed.emplace("broken", absl::InvalidArgumentError("config.json: bad d_model"));
  table.loading.insert("fresh");
  table.default_model = "demo";
  return table;
}

TEST(ModelRouterTest, RoutesServingModelsAndTheDefault) {
  ModelRouter router;
  router.Publish(Table());
  absl::StatusOr<ModelRoute> a = router.Route("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->model->name, "a");
  EXPECT_EQ(a->limits.request.max_sequence_length, 10);
  EXPECT_FALSE(a->is_default);

  absl::StatusOr<ModelRoute> unnamed = router.Route("");
  ASSERT_TRUE(unnamed.ok()) << unnamed.status();
  EXPECT_EQ(unnamed->model->name, "demo");
  EXPECT_TRUE(unnamed->is_default);
  EXPECT_EQ(router.DefaultModelName(), "demo");

  std::vector<std::string> names;
  for (const ModelRoute& route : router.Routes()) {
    names.push_back(route.model->name + (route.is_default ? "*" : ""));
  }
  EXPECT_THAT(names, ElementsAre("a", "demo*"));
}

TEST(ModelRouterTest, UnknownFailedAndLoadingNamesGetClearStatuses) {
  ModelRouter router;
  router.Publish(Table());
  absl::Status unknown = router.Route("nope").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("model \"nope\" not found; serving: a, demo"));

  absl::Status failed = router.Route("broken").status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.message(), HasSubstr("failed to load: config.json: bad d_model"));

  absl::Status loading = router.Route("fresh").status();
  EXPECT_EQ(loading.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(loading.message(), HasSubstr("is loading; retry"));
}

TEST(ModelRouterTest, NoDefaultModelNamesTheChoices) {
  ModelRouter router;
  RoutingTable table = Table();
  table.default_model.clear();
  router.Publish(table);
  absl::Status status = router.Route("").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("--default-model"));
  EXPECT_THAT(status.message(), HasSubstr("[a, demo]"));
}

TEST(ModelRouterTest, APublishedTableReplacesTheLastOne) {
  ModelRouter router;
  router.Publish(Table());
  router.Publish({});
  EXPECT_EQ(router.Route("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(router.Routes().empty());
  EXPECT_EQ(router.DefaultModelName(), "");
}

}  // namespace
}  // namespace attnserve::server
