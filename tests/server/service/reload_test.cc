// Models change without a restart: the server polls its repository, serves a new model folder,
// swaps a changed one in (requests then get the new version's answer), and stops serving a
// removed one — with health following along.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/forward/attention_weights.h"
#include "core/model/model_writer.h"
#include "core/model/weight_naming.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/server/service/server_test_support.h"
#include "tests/support/file_edit.h"

namespace attnserve::testing {
namespace {

using HealthStatus = grpc::health::v1::HealthCheckResponse;

model::ModelConfig SmallConfig() {
  model::ModelConfig config;
  config.attention = {.d_model = kSmallWidth,
                      .num_heads = kSmallHeads,
                      .variant = core::AttentionVariant::kMultiHead,
                      .bias = true};
  return config;
}

class ReloadTest : public ServerTest {
 protected:
  void SetUp() override {
    server::ServerOptions options = TestServerOptions();
    options.model_poll_interval_ms = 20;
    StartServer(options);
  }

  // Waits (bounded) until `condition` holds; the poller runs every 20 ms.
  static ::testing::AssertionResult Eventually(const std::function<bool()>& condition) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!condition()) {
      if (std::chrono::steady_clock::now() > give_up) {
        return ::testing::AssertionFailure() << "not within 30 s";
      }
      std::this_thread::yield();
    }
    return ::testing::AssertionSuccess();
  }

  int64_t ServingVersion(const std::string& name) {
    absl::StatusOr<server::ModelRoute> route = server().router().Route(name);
    return route.ok() ? route->model->version : 0;
  }

  HealthStatus::ServingStatus Health(const std::string& name) {
    auto health = grpc::health::v1::Health::NewStub(channel());
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(name);
    HealthStatus response;
    const grpc::Status status = health->Check(&context, request, &response);
    return status.ok() ? response.status() : HealthStatus::UNKNOWN;
  }

  absl::Status WriteSmall(const std::string& name, uint64_t seed) {
    const model::ModelConfig config = SmallConfig();
    return model::WriteModelFolder(repository() / name, config,
                                   core::MakeRandomWeights(config.attention, seed),
                                   model::WeightNaming::kSeed, model::TensorDtype::kF32);
  }
};

TEST_F(ReloadTest, ChangedWeightsAreServedAsTheNextVersion) {
  const v1::AttendRequest request = MakeRequest(kSmallModel, 4, kSmallWidth, 9);
  v1::AttendResponse before;
  ASSERT_TRUE(Attend(request, &before).ok());
  EXPECT_EQ(before.model_version(), 1);

  ASSERT_TRUE(WriteSmall(kSmallModel, 999).ok());
  ASSERT_TRUE(Eventually([&] { return ServingVersion(kSmallModel) == 2; }));
  v1::AttendResponse after;
  ASSERT_TRUE(Attend(request, &after).ok());
  EXPECT_EQ(after.model_version(), 2);
  EXPECT_TRUE(
      Near(TensorValues(after.output()),
           CoreCompute(*Layer(kSmallModel), {.query = TestValues(4 * kSmallWidth, 9)}).output));
  EXPECT_FALSE(Near(TensorValues(after.output()), TensorValues(before.output())));
}

// A reload whose new version has tighter limits changes the queue's limits only once the new
// version is published: while it warms up, requests valid for the serving version are still
// taken. (A queue refusal, "task has ...", seen while version 1 still serves is the failure;
// once version 2 serves, the conversion refuses such requests by its limits, as it should.)
TEST_F(ReloadTest, TheServingVersionsRequestsAreTakenWhileTheNextWarmsUp) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> answered_by_v1{0};
  std::mutex mu;
  std::vector<std::string> refused_while_v1;
  std::thread client([&] {
    const v1::AttendRequest request = MakeRequest(kSmallModel, 12, kSmallWidth, 3);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!stop.load() && std::chrono::steady_clock::now() < give_up) {
      v1::AttendResponse response;
      const grpc::Status status = Attend(request, &response);
      if (status.ok()) {
        if (response.model_version() == 1) answered_by_v1.fetch_add(1);
      } else if (ServingVersion(kSmallModel) == 1) {
        std::lock_guard<std::mutex> lock(mu);
        refused_while_v1.push_back(status.error_message());
      }
    }
  });
  ASSERT_TRUE(Eventually([&] { return answered_by_v1.load() >= 20; }));
  model::ModelConfig tight = SmallConfig();
  tight.batching.max_batch_tokens = 8;
  tight.batching.max_queue_size = 1;
  ASSERT_TRUE(model::WriteModelFolder(repository() / kSmallModel, tight,
                                      core::MakeRandomWeights(tight.attention, 77),
                                      model::WeightNaming::kSeed, model::TensorDtype::kF32)
                  .ok());
  ASSERT_TRUE(Eventually([&] { return ServingVersion(kSmallModel) == 2; }));
  stop.store(true);
  client.join();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(refused_while_v1, ::testing::IsEmpty());
}

TEST_F(ReloadTest, AddedAndRemovedFoldersComeAndGo) {
  EXPECT_EQ(Health("late"), HealthStatus::UNKNOWN);  // NOT_FOUND from the health service.
  ASSERT_TRUE(WriteSmall("late", 5).ok());
  ASSERT_TRUE(Eventually([&] { return ServingVersion("late") == 1; }));
  // Health follows the route once the swap is done (the listener runs after it).
  EXPECT_TRUE(Eventually([&] { return Health("late") == HealthStatus::SERVING; }));
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(MakeRequest("late", 2, kSmallWidth, 1), &response).ok());

  std::filesystem::remove_all(repository() / "late");
  ASSERT_TRUE(Eventually([&] { return ServingVersion("late") == 0; }));
  EXPECT_TRUE(Eventually([&] { return Health("late") == HealthStatus::NOT_SERVING; }));
  const grpc::Status gone = Attend(MakeRequest("late", 2, kSmallWidth, 1), &response);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(gone.error_message(), ::testing::HasSubstr("late"));
}

// A client that saw version 1 of "late" never sees that number again with other weights: the
// restored folder serves as version 2, in answers and in GetModel alike.
TEST_F(ReloadTest, ARestoredFolderContinuesItsVersions) {
  ASSERT_TRUE(WriteSmall("late", 5).ok());
  ASSERT_TRUE(Eventually([&] { return ServingVersion("late") == 1; }));
  std::filesystem::remove_all(repository() / "late");
  ASSERT_TRUE(Eventually([&] { return ServingVersion("late") == 0; }));

  ASSERT_TRUE(WriteSmall("late", 6).ok());
  ASSERT_TRUE(Eventually([&] { return ServingVersion("late") == 2; }));
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(MakeRequest("late", 2, kSmallWidth, 1), &response).ok());
  EXPECT_EQ(response.model_version(), 2);
  grpc::ClientContext context;
  v1::GetModelRequest request;
  request.set_name("late");
  v1::ModelInfo info;
  ASSERT_TRUE(stub().GetModel(&context, request, &info).ok());
  EXPECT_EQ(info.version(), 2);
}

// The hostile-user case: weights zeroed in place under config.json's digest (as every writer
// records it) are refused; version 1 keeps answering.
TEST_F(ReloadTest, WeightsDamagedInPlaceKeepTheServingVersion) {
  const std::filesystem::path weights = repository() / kSmallModel / "weights.safetensors";
  ZeroInPlace(weights, std::filesystem::file_size(weights) / 2, 64);
  ASSERT_FALSE(HasFatalFailure());
  absl::Status error;
  ASSERT_TRUE(Eventually([&] {
    for (const repository::ModelState& state : server().lifecycle().States()) {
      if (state.name == kSmallModel && !state.last_error.ok()) error = state.last_error;
    }
    return !error.ok();
  }));
  EXPECT_EQ(error.code(), absl::StatusCode::kDataLoss) << error;
  EXPECT_THAT(std::string(error.message()), ::testing::HasSubstr("SHA-256 mismatch"));
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(MakeRequest(kSmallModel, 3, kSmallWidth, 2), &response).ok());
  EXPECT_EQ(response.model_version(), 1);
  EXPECT_EQ(Health(kSmallModel), HealthStatus::SERVING);
}

TEST_F(ReloadTest, BrokenUpdateKeepsTheServingVersion) {
  std::filesystem::resize_file(repository() / kSmallModel / "weights.safetensors", 100);
  // The failed load is recorded; the old version keeps answering meanwhile.
  ASSERT_TRUE(Eventually([&] {
    for (const repository::ModelState& state : server().lifecycle().States()) {
      if (state.name == kSmallModel && !state.last_error.ok()) return true;
    }
    return false;
  }));
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(MakeRequest(kSmallModel, 3, kSmallWidth, 2), &response).ok());
  EXPECT_EQ(response.model_version(), 1);
  EXPECT_EQ(Health(kSmallModel), HealthStatus::SERVING);
}

}  // namespace
}  // namespace attnserve::testing
