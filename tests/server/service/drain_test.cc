// Draining: Server::Shutdown answers every accepted request (without waiting out the batching
// delay), refuses new ones, turns health NOT_SERVING and closes idle streams.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/server/service/async_call.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using HealthStatus = grpc::health::v1::HealthCheckResponse;

class DrainTest : public ServerTest {
 protected:
  void StartHeldBack() {
    server::ServerOptions options = TestServerOptions();
    options.model_limits.batching.max_queue_delay_us = 60'000'000;
    StartServer(options);
  }
  HealthStatus::ServingStatus Check(const std::string& service, grpc::StatusCode* code) {
    auto health = grpc::health::v1::Health::NewStub(channel());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    HealthStatus response;
    *code = health->Check(&context, request, &response).error_code();
    return response.status();
  }
};

TEST_F(DrainTest, ShutdownAnswersEveryAcceptedRequestAndRefusesNewOnes) {
  StartHeldBack();
  std::vector<std::unique_ptr<AsyncCall>> calls;
  for (int i = 0; i < 8; ++i) {
    calls.push_back(
        std::make_unique<AsyncCall>(stub(), MakeRequest(kSmallModel, 1 + i, kSmallWidth, i)));
  }
  absl::StatusOr<server::ModelRoute> route = server().router().Route(kSmallModel);
  ASSERT_TRUE(route.ok());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (route->queue->QueueSize() != 8) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::yield();
  }

  server().Shutdown(absl::Seconds(10));
  for (size_t i = 0; i < calls.size(); ++i) {
    ASSERT_TRUE(calls[i]->Wait());
    ASSERT_TRUE(calls[i]->status().ok()) << i << ": " << calls[i]->status().error_message();
    EXPECT_EQ(calls[i]->response().timing().batch_sequences(), 8);
    EXPECT_TRUE(Near(
        TensorValues(calls[i]->response().output()),
        CoreCompute(*route->model->layer, {.query = TestValues((1 + i) * kSmallWidth, i)}).output));
  }
  v1::AttendResponse response;
  EXPECT_EQ(Attend(MakeRequest(kSmallModel, 2, kSmallWidth, 1), &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(DrainTest, HealthReportsTheServerAndEachModel) {
  StartServer();
  grpc::StatusCode code;
  EXPECT_EQ(Check("", &code), HealthStatus::SERVING);
  EXPECT_EQ(code, grpc::StatusCode::OK);
  EXPECT_EQ(Check(server::kServiceHealthName, &code), HealthStatus::SERVING);
  EXPECT_EQ(Check(kSmallModel, &code), HealthStatus::SERVING);
  EXPECT_EQ(Check(kSingleModel, &code), HealthStatus::SERVING);
  Check("no-such-model", &code);
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
}

TEST_F(DrainTest, HealthWatchersSeeNotServingWhenTheDrainStarts) {
  StartServer();
  auto health = grpc::health::v1::Health::NewStub(channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(kSmallModel);
  auto watch = health->Watch(&context, request);
  HealthStatus status;
  ASSERT_TRUE(watch->Read(&status));
  EXPECT_EQ(status.status(), HealthStatus::SERVING);

  // The watch is an open RPC: Shutdown cancels it at the end of its (short) grace period.
  std::thread stopper([this] { server().Shutdown(absl::Milliseconds(500)); });
  ASSERT_TRUE(watch->Read(&status));
  EXPECT_EQ(status.status(), HealthStatus::NOT_SERVING);
  while (watch->Read(&status)) {
  }
  watch->Finish().IgnoreError();
  stopper.join();
}

TEST_F(DrainTest, ShutdownClosesAnIdleStreamWithOk) {
  StartServer();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub().AttendStream(&context);
  v1::AttendRequest request = MakeRequest(kSmallModel, 3, kSmallWidth, 1);
  request.set_request_id("before drain");
  ASSERT_TRUE(stream->Write(request));
  v1::AttendResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), "before drain");

  server().Shutdown(absl::Seconds(10));
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// What 64 closed-loop clients saw of one drain under load: every call either answered OK or
// refused UNAVAILABLE (gRPC's retry policies and the client libraries retry it on another
// replica), never CANCELLED.
struct LoadOutcome {
  int64_t ok = 0;
  int64_t unavailable = 0;
  std::map<grpc::StatusCode, int64_t> other;
};

LoadOutcome DrainUnderLoad(server::Server& server) {
  constexpr int kChannels = 4;
  constexpr int kThreadsPerChannel = 16;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < kChannels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("attnserve.test.channel", c);  // A connection of its own each.
    channels.push_back(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server.port()),
                                                 grpc::InsecureChannelCredentials(), args));
  }
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> answered{0};
  std::mutex mu;
  LoadOutcome outcome;
  std::vector<std::thread> clients;
  for (int t = 0; t < kChannels * kThreadsPerChannel; ++t) {
    clients.emplace_back([&, t] {
      auto stub = v1::AttentionService::NewStub(channels[t % kChannels]);
      const v1::AttendRequest request = MakeRequest(kSmallModel, 4, kSmallWidth, t);
      LoadOutcome mine;
      // Bounded: until the server has stopped (then one more call, refused by a closed
      // listener), at most 60 s.
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      bool last = false;
      while (!last && std::chrono::steady_clock::now() < give_up) {
        last = stopped.load();
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        v1::AttendResponse response;
        const grpc::Status status = stub->Attend(&context, request, &response);
        if (status.ok()) {
          ++mine.ok;
          answered.fetch_add(1);
        } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
          ++mine.unavailable;
        } else {
          ++mine.other[status.error_code()];
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      outcome.ok += mine.ok;
      outcome.unavailable += mine.unavailable;
      for (const auto& [code, count] : mine.other) outcome.other[code] += count;
    });
  }
  // Under load: every client has had answers.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (answered.load() < 2000 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  server.Shutdown(absl::Seconds(10));
  stopped.store(true);
  for (std::thread& client : clients) client.join();
  return outcome;
}

TEST_F(DrainTest, UnderLoadACallIsAnsweredOrRefusedUnavailableNeverCancelled) {
  for (int run = 0; run < 3; ++run) {
    StartServer();
    const LoadOutcome outcome = DrainUnderLoad(server());
    EXPECT_GE(outcome.ok, 2000) << "run " << run;
    EXPECT_GE(outcome.unavailable, 64) << "run " << run;  // Each client's last call at least.
    for (const auto& [code, count] : outcome.other) {
      ADD_FAILURE() << "run " << run << ": " << count << " calls ended with status " << code;
    }
    StopServer();
  }
}

}  // namespace
}  // namespace attnserve::testing
