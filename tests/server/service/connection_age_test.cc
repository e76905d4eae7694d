// Connection limits. --max-connection-age-s: the server sends a GOAWAY to connections older than
// the age, so a client's channel leaves READY and its next call opens a new connection (which is
// when it would re-resolve DNS and find new replicas), while calls already open on the old
// connection run on through the grace period. --max-connection-idle-s: a connection with no call
// open, even one that never started HTTP/2, is closed. --max-concurrent-streams: calls past it on
// one connection wait.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

  // The GOAWAY arrives about 300 ms after the connection opened (gRPC adds ±10 % jitter); in a
  // slow build (TSan) it may have come already, so wait only while the channel is still READY.
  const auto aged_by = In(std::chrono::seconds(30));
  while (channel()->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
    ASSERT_TRUE(channel()->WaitForStateChange(GRPC_CHANNEL_READY, aged_by))
        << "the server never aged the connection out";
  }

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

// Opens a TCP connection to `port` that never says anything (not even HTTP/2's preface) and
// expects the server to close it within 30 s.
void ExpectASilentConnectionIsClosed(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  timeval patience{.tv_sec = 30, .tv_usec = 0};  // A bound, not the expected time.
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience)), 0);
  // The server's SETTINGS frame may come first; then the close (0) or a reset (ECONNRESET).
  char buffer[4096];
  ssize_t got = 0;
  do {
    got = recv(fd, buffer, sizeof(buffer), 0);
  } while (got > 0);
  const bool closed = got == 0 || errno == ECONNRESET;
  EXPECT_TRUE(closed) << "recv: " << got << ", errno " << errno
                      << " (EAGAIN: still open after 30 s)";
  close(fd);
}

// A client that connects and then says nothing does not hold its file descriptor forever: the
// server closes the connection once it has been idle for the limit...
TEST_F(ConnectionAgeTest, AnIdleConnectionThatNeverSpeaksIsClosed) {
  server::ServerOptions options = TestServerOptions();
  options.max_connection_idle_ms = 300;
  StartServer(options);
  ExpectASilentConnectionIsClosed(server().port());
  // The server goes on serving.
  v1::AttendResponse unary;
  EXPECT_TRUE(Attend(MakeRequest(kSmallModel, 2, kSmallWidth, /*seed=*/3), &unary).ok());
}

// ...and, with no idle limit, once its handshake has taken longer than handshake_timeout_ms.
TEST_F(ConnectionAgeTest, AConnectionThatNeverFinishesItsHandshakeIsClosed) {
  server::ServerOptions options = TestServerOptions();
  options.max_connection_idle_ms = 0;
  options.handshake_timeout_ms = 300;
  StartServer(options);
  ExpectASilentConnectionIsClosed(server().port());
  v1::AttendResponse unary;
  EXPECT_TRUE(Attend(MakeRequest(kSmallModel, 2, kSmallWidth, /*seed=*/4), &unary).ok());
}

TEST_F(ConnectionAgeTest, BadConnectionLimitsAreRefusedNamingTheOption) {
  for (const auto& [name, change] :
       std::vector<std::pair<std::string, std::function<void(server::ServerOptions&)>>>{
           {"max_connection_idle_ms",
            [](server::ServerOptions& o) { o.max_connection_idle_ms = -1; }},
           {"keepalive_time_ms", [](server::ServerOptions& o) { o.keepalive_time_ms = 10; }},
           {"max_concurrent_streams",
            [](server::ServerOptions& o) { o.max_concurrent_streams = 0; }},
           {"max_stream_unsent_bytes",
            [](server::ServerOptions& o) { o.max_stream_unsent_bytes = 0; }},
           {"max_streams_unsent_bytes",
            [](server::ServerOptions& o) { o.max_streams_unsent_bytes = 0; }},
           {"grpc_memory_bytes", [](server::ServerOptions& o) { o.grpc_memory_bytes = -1; }},
           {"handshake_timeout_ms", [](server::ServerOptions& o) { o.handshake_timeout_ms = -1; }},
       }) {
    SCOPED_TRACE(name);
    server::ServerOptions options = TestServerOptions();
    change(options);
    absl::StatusOr<std::unique_ptr<server::Server>> server = server::Server::Start(options);
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(server.status().message().find(name), std::string::npos) << server.status();
  }
}

}  // namespace
}  // namespace attnserve::testing
