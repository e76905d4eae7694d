// The Open Inference Protocol's service end to end, in-process: ModelInfer answers as Attend
// does (bit for bit), health names the service, and a drain answers accepted ModelInfer calls
// and turns ServerReady false.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

inference::ModelInferRequest InferRequest(const v1::AttendRequest& attend) {
  inference::ModelInferRequest request;
  request.set_model_name(attend.model());
  auto* input = request.add_inputs();
  input->set_name("input");
  input->set_datatype("FP32");
  input->mutable_shape()->CopyFrom(attend.input().shape());
  const std::vector<float> values(attend.input().values().begin(), attend.input().values().end());
  request.add_raw_input_contents(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return request;
}

class InferenceServiceTest : public ServerTest {
 protected:
  std::unique_ptr<inference::GRPCInferenceService::Stub> Infer() {
    return inference::GRPCInferenceService::NewStub(channel());
  }
};

TEST_F(InferenceServiceTest, ModelInferEqualsAttendBitForBit) {
  StartServer();
  const v1::AttendRequest attend = MakeRequest(kSmallModel, 5, kSmallWidth, 3);
  v1::AttendRequest raw_attend = attend;
  raw_attend.set_raw_output(true);
  v1::AttendResponse expected;
  ASSERT_TRUE(Attend(raw_attend, &expected).ok());
  grpc::ClientContext context;
  inference::ModelInferResponse response;
  const grpc::Status status = Infer()->ModelInfer(&context, InferRequest(attend), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.raw_output_contents_size(), 1);
  EXPECT_EQ(response.raw_output_contents(0), expected.output().raw());
}

TEST_F(InferenceServiceTest, HealthAnswersForTheService) {
  StartServer();
  auto health = grpc::health::v1::Health::NewStub(channel());
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(server::kInferenceHealthName);
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(InferenceServiceTest, DrainAnswersAcceptedCallsAndIsNotReady) {
  server::ServerOptions options = TestServerOptions();
  options.model_limits.batching.max_queue_delay_us = 60'000'000;  // Held until the drain.
  StartServer(options);
  auto stub = Infer();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const inference::ModelInferRequest request =
      InferRequest(MakeRequest(kSmallModel, 3, kSmallWidth, 1));
  inference::ModelInferResponse response;
  std::mutex mutex;
  std::condition_variable answered;
  bool done = false;
  grpc::Status status;
  stub->async()->ModelInfer(&context, &request, &response, [&](grpc::Status s) {
    std::lock_guard lock(mutex);
    status = s;
    done = true;
    answered.notify_all();
  });
  absl::StatusOr<server::ModelRoute> route = server().router().Route(kSmallModel);
  ASSERT_TRUE(route.ok());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (route->queue->QueueSize() != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::yield();
  }
  server().service().BeginDrain();  // What Shutdown starts with.
  grpc::ClientContext ready_context;
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(stub->ServerReady(&ready_context, {}, &ready).ok());
  EXPECT_FALSE(ready.ready());
  // A new ModelInfer is refused, but only once the drain has sent GOAWAY (drain_gate.h): held
  // until Shutdown below.
  grpc::ClientContext refused_context;
  refused_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  inference::ModelInferResponse refused;
  bool refused_done = false;
  grpc::Status refused_status;
  stub->async()->ModelInfer(&refused_context, &request, &refused, [&](grpc::Status s) {
    std::lock_guard lock(mutex);
    refused_status = s;
    refused_done = true;
    answered.notify_all();
  });
  while (server().service().open_calls().held() != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::yield();
  }
  server().Shutdown(absl::Seconds(10));
  std::unique_lock lock(mutex);
  ASSERT_TRUE(
      answered.wait_for(lock, std::chrono::seconds(30), [&] { return done && refused_done; }));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(refused_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused_status.error_message().find("draining"), std::string::npos)
      << refused_status.error_message();
}

}  // namespace
}  // namespace attnserve::testing
