// The client's channel policies against scripted stand-in servers: which codes are retried and
// how often, and round-robin over several addresses.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/client/client.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "gtest/gtest.h"

namespace attnserve::testing {
namespace {

namespace ac = ::attnserve::client;

// Answers its first `failures` Attend calls with `code`, later ones by echoing the input.
class ScriptedService final : public v1::AttentionService::Service {
 public:
  ScriptedService(int failures, grpc::StatusCode code) : failures_(failures), code_(code) {}

  grpc::Status Attend(grpc::ServerContext* /*context*/, const v1::AttendRequest* request,
                      v1::AttendResponse* response) override {
    if (calls_.fetch_add(1) < failures_) return grpc::Status(code_, "scripted refusal");
    *response->mutable_output() = request->input();
    return grpc::Status::OK;
  }
  int calls() const { return calls_.load(); }

 private:
  const int failures_;
  const grpc::StatusCode code_;
  std::atomic<int> calls_{0};
};

// A ScriptedService on 127.0.0.1 with an ephemeral port.
class ScriptedServer {
 public:
  explicit ScriptedServer(int failures = 0, grpc::StatusCode code = grpc::StatusCode::OK)
      : service_(failures, code) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(64 << 20);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedServer() { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int calls() const { return service_.calls(); }

 private:
  ScriptedService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// The outcome of one Attend of a [rows, 8] input.
absl::Status AttendOnce(ac::Client& client, int64_t rows = 2) {
  const std::vector<float> input(static_cast<size_t>(rows * 8), 0.25f);
  absl::StatusOr<ac::AttendResult> result = client.Attend("m", {input, {rows, 8}});
  if (result.ok() && result->output.data != input) return absl::InternalError("not the echo");
  return result.status();
}

std::unique_ptr<ac::Client> Connect(const std::string& target, ac::ClientOptions options = {}) {
  options.initial_backoff = std::chrono::milliseconds(1);  // Keep the tests fast.
  options.max_backoff = std::chrono::milliseconds(5);
  absl::StatusOr<std::unique_ptr<ac::Client>> client = ac::Client::Create(target, options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(RetryTest, AFullQueueIsRetriedUntilItSucceeds) {
  ScriptedServer server(/*failures=*/2, grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::unique_ptr<ac::Client> client = Connect(server.address(), {.max_attempts = 4});
  EXPECT_TRUE(AttendOnce(*client).ok());
  EXPECT_EQ(server.calls(), 3);
}

TEST(RetryTest, UnavailableIsRetriedToo) {
  ScriptedServer server(/*failures=*/1, grpc::StatusCode::UNAVAILABLE);
  std::unique_ptr<ac::Client> client = Connect(server.address());
  EXPECT_TRUE(AttendOnce(*client).ok());
  EXPECT_EQ(server.calls(), 2);
}

// A draining server's gRPC cancels the calls it has not started: another attempt (on another
// replica, or after the restart) answers them.
TEST(RetryTest, CancelledByTheServerIsRetried) {
  ScriptedServer server(/*failures=*/1, grpc::StatusCode::CANCELLED);
  std::unique_ptr<ac::Client> client = Connect(server.address());
  EXPECT_TRUE(AttendOnce(*client).ok());
  EXPECT_EQ(server.calls(), 2);
}

TEST(RetryTest, RetriesStopAtMaxAttemptsWithTheServersError) {
  ScriptedServer server(/*failures=*/100, grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::unique_ptr<ac::Client> client = Connect(server.address(), {.max_attempts = 3});
  const absl::Status status = AttendOnce(*client);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "scripted refusal");
  EXPECT_EQ(server.calls(), 3);
}

TEST(RetryTest, OneAttemptMeansNoRetry) {
  ScriptedServer server(/*failures=*/1, grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::unique_ptr<ac::Client> client = Connect(server.address(), {.max_attempts = 1});
  EXPECT_EQ(AttendOnce(*client).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(server.calls(), 1);
}

TEST(RetryTest, OtherErrorsAreNeverRetried) {
  for (grpc::StatusCode code : {grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::INTERNAL,
                                grpc::StatusCode::DEADLINE_EXCEEDED}) {
    ScriptedServer server(/*failures=*/1, code);
    std::unique_ptr<ac::Client> client = Connect(server.address());
    EXPECT_EQ(static_cast<int>(AttendOnce(*client).code()), static_cast<int>(code));
    EXPECT_EQ(server.calls(), 1) << code;
  }
}

TEST(RetryTest, LargeRequestsAreRetriedAsWell) {
  // 400 KiB: beyond gRPC's default 256 KiB retry buffer, which would commit the call unretried.
  ScriptedServer server(/*failures=*/1, grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::unique_ptr<ac::Client> client = Connect(server.address());
  EXPECT_TRUE(AttendOnce(*client, /*rows=*/12800).ok());
  EXPECT_EQ(server.calls(), 2);
}

TEST(BalancingTest, RoundRobinAlternatesOverEveryAddress) {
  ScriptedServer a, b;
  std::unique_ptr<ac::Client> client =
      Connect(absl::StrCat("ipv4:", a.address(), ",", b.address()));
  // The first calls may all go to whichever connection is ready first: call until both have
  // served one (under load the second connection can take more than a few calls; bounded).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int i = 0; i < 2000 && (a.calls() == 0 || b.calls() == 0); ++i) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "one address never got a call";
    ASSERT_TRUE(AttendOnce(*client).ok());
  }
  ASSERT_GT(a.calls(), 0);
  ASSERT_GT(b.calls(), 0);
  const int a_before = a.calls(), b_before = b.calls();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(AttendOnce(*client).ok());
  EXPECT_EQ(a.calls() - a_before, 10);
  EXPECT_EQ(b.calls() - b_before, 10);
}

TEST(BalancingTest, PickFirstUsesOneAddress) {
  ScriptedServer a, b;
  std::unique_ptr<ac::Client> client = Connect(absl::StrCat("ipv4:", a.address(), ",", b.address()),
                                               {.load_balancing_policy = "pick_first"});
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(AttendOnce(*client).ok());
  EXPECT_EQ(a.calls(), 20);
  EXPECT_EQ(b.calls(), 0);
}

}  // namespace
}  // namespace attnserve::testing
