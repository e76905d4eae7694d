// --max-connection-age-s: the server sends a GOAWAY to connections older than the age, so a
// client's channel leaves READY and its next call opens a new connection (which is when it would
// re-resolve DNS and find new replicas), while calls already open on the old connection run on
// through the grace period.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

std::chrono::system_clock::time_point In(std::chrono::seconds seconds) {
  return std::chrono::system_clock::now() + seconds;
}

class ConnectionAgeTest : public ServerTest {};

TEST_F(ConnectionAgeTest, OldConnectionsAreAskedToReconnectWhileOpenCallsFinish) {
  server::ServerOptions options = TestServerOptions();
  options.max_connection_age_ms = 300;
  options.max_connection_age_grace_ms = 60000;
  StartServer(options);

  grpc::ClientContext context;
  context.set_deadline(In(std::chrono::seconds(60)));
  auto stream = stub().AttendStream(&context);
  v1::AttendRequest request = MakeRequest(kSmallModel, 3, kSmallWidth, /*seed=*/1);
  request.set_request_id("before");
  ASSERT_TRUE(stream->Write(request));
  v1::AttendResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), "before");
  ASSERT_EQ(channel()->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_READY);

  // The GOAWAY arrives about 300 ms after the connection opened (gRPC adds ±10 % jitter).
  ASSERT_TRUE(channel()->WaitForStateChange(GRPC_CHANNEL_READY, In(std::chrono::seconds(30))))
      << "the server never aged the connection out";
  EXPECT_NE(channel()->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_READY);

  // The stream opened before the GOAWAY still gets answers, then ends OK.
  request.set_request_id("after");
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), "after");
  EXPECT_FALSE(response.has_error()) << response.error().message();
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());

  // A new call opens a new connection and is served.
  v1::AttendResponse unary;
  EXPECT_TRUE(Attend(MakeRequest(kSmallModel, 2, kSmallWidth, /*seed=*/2), &unary).ok());
}

TEST_F(ConnectionAgeTest, ANegativeAgeIsRefusedNamingTheOption) {
  server::ServerOptions options = TestServerOptions();
  options.max_connection_age_ms = -1;
  absl::StatusOr<std::unique_ptr<server::Server>> server = server::Server::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("max_connection_age_ms"), std::string::npos)
      << server.status();
}

}  // namespace
}  // namespace attnserve::testing
