// The attnserve binary as users run it: --help, flag errors, a config file, JSON logs, the
// startup summary, serving the embedded demo model, and SIGTERM draining every accepted request
// before exiting 0.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "core/kv_cache/int8_dot_kernel.h"
#include "nlohmann/json.hpp"
#include "tests/server/service/async_call.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kStartTimeout = absl::Seconds(60);

class AttnserveBinaryTest : public ::testing::Test {
 protected:
  // Starts attnserve on 127.0.0.1 with an ephemeral port and no repository folder (so the
  // embedded demo model serves), plus `extra` flags and `environment` (NAME=value entries, set
  // through env(1)), run by `launcher` (a command prefix such as prlimit's) if given; returns null
  // on failure.
  std::unique_ptr<ChildProcess> StartServer(const std::vector<std::string>& extra,
                                            const std::vector<std::string>& environment = {},
                                            const std::vector<std::string>& launcher = {}) {
    std::vector<std::string> args = {"--grpc-address",     "127.0.0.1:0",
                                     "--http-address",     "127.0.0.1:0",
                                     "--metrics-address",  "127.0.0.1:0",
                                     "--model-repository", (temp_.path() / "absent").string(),
                                     "--compute-threads",  "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string program = ATTNSERVE_BINARY;
    if (!environment.empty()) {
      args.insert(args.begin(), program);
      args.insert(args.begin(), environment.begin(), environment.end());
      program = "/usr/bin/env";
    }
    if (!launcher.empty()) {
      args.insert(args.begin(), program);
      args.insert(args.begin(), launcher.begin() + 1, launcher.end());
      program = launcher.front();
    }
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(program, args);
    EXPECT_TRUE(child.ok()) << child.status();
    if (!child.ok()) return nullptr;
    std::optional<std::string> listening = (*child)->WaitForLine("(port ", kStartTimeout);
    EXPECT_TRUE(listening.has_value()) << (*child)->Output();
    if (!listening) return nullptr;
    const size_t at = listening->find("(port ") + 6;
    EXPECT_TRUE(absl::SimpleAtoi(listening->substr(at, listening->find(')', at) - at), &port_))
        << *listening;
    return *std::move(child);
  }
  std::unique_ptr<v1::AttentionService::Stub> Stub() const {
    return v1::AttentionService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }

  TempFolder temp_;
  int port_ = 0;
};

// Runs attnserve with `args` to completion; its exit code and output.
std::pair<int, std::string> RunToExit(const std::vector<std::string>& args) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(ATTNSERVE_BINARY, args);
  if (!child.ok()) return {-1, child.status().ToString()};
  const int code = (*child)->Wait(absl::Seconds(60));
  return {code, (*child)->Output()};
}

TEST(AttnserveFlagsTest, HelpListsEveryFlagWithItsDefault) {
  const auto [code, output] = RunToExit({"--help"});
  EXPECT_EQ(code, 0);
  for (const char* flag : {"--grpc-address TEXT=0.0.0.0:50051",
                           "--metrics-address TEXT=0.0.0.0:8002",
                           "--model-repository",
                           "--config",
                           "--demo-model",
                           "--default-model",
                           "--model-poll-interval-s",
                           "--max-batch-sequences",
                           "--max-batch-tokens",
                           "--max-queue-delay-us",
                           "--max-queue-size",
                           "--batch-threads",
                           "--max-sequence-length",
                           "--compute-threads",
                           "--parallel-min-mflop",
                           "--max-message-bytes",
                           "--shutdown-grace-s",
                           "--max-connection-age-s FLOAT:FLOAT in [0 - 86400]=0",
                           "--max-connection-age-grace-s",
                           "--max-connection-idle-s FLOAT:FLOAT in [0 - 86400]=300",
                           "--keepalive-time-s",
                           "--keepalive-timeout-s",
                           "--max-concurrent-streams",
                           "--max-queued-bytes",
                           "--log-level",
                           "--log-format",
                           "--tls-cert-chain",
                           "--tls-private-key",
                           "--tls-client-ca",
                           "--tls-refresh-interval-s INT:INT in [1 - 86400]=10",
                           "(Env:ATTNSERVE_TLS_CLIENT_CA)",
                           "(Env:ATTNSERVE_GRPC_ADDRESS)",
                           "(Env:ATTNSERVE_MAX_CONNECTION_AGE_GRACE_S)"}) {
    EXPECT_THAT(output, HasSubstr(flag));
  }
}

TEST(AttnserveFlagsTest, BadFlagValuesExitNonZeroNamingTheFlag) {
  {
    const auto [code, output] = RunToExit({"--log-format", "xml"});
    EXPECT_NE(code, 0);
    EXPECT_THAT(output, HasSubstr("--log-format"));
  }
  {
    const auto [code, output] = RunToExit({"--max-batch-sequences", "0"});
    EXPECT_NE(code, 0);
    EXPECT_THAT(output, HasSubstr("--max-batch-sequences"));
  }
}

TEST_F(AttnserveBinaryTest, UnbindableAddressExitsOneWithTheReason) {
  const auto [code, output] = RunToExit({"--grpc-address", "256.1.1.1:1", "--http-address", "",
                                         "--model-repository", (temp_.path() / "absent").string()});
  EXPECT_EQ(code, 1);
  EXPECT_THAT(output, HasSubstr("grpc_address"));
  EXPECT_THAT(output, HasSubstr("256.1.1.1:1"));
}

TEST_F(AttnserveBinaryTest, StartupSummaryDescribesTheDemoModelAndTheMachine) {
  std::unique_ptr<ChildProcess> server = StartServer({});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitForLine("threads:", kStartTimeout).has_value()) << server->Output();
  const std::string output = server->Output();
  EXPECT_THAT(output, HasSubstr("model demo (default) v1: d_model=512 heads=8 multi_head"));
  EXPECT_THAT(output, HasSubstr("parameters=1050624"));
  EXPECT_THAT(output, HasSubstr("max_batch_sequences=64"));
  EXPECT_THAT(output, HasSubstr("oneDNN 2."));
  EXPECT_THAT(output, HasSubstr(attnserve::core::HasInt8DotKernel()
                                    ? "int8 KV cache kernel: integer dot products (AVX-512 VNNI)"
                                    : "int8 KV cache kernel: fp32 widening (no AVX-512 VNNI)"));
  EXPECT_THAT(output, HasSubstr("1 compute thread(s) shared by all batches"));
  // No repository folder: the summary says the embedded demo serves for want of one.
  EXPECT_THAT(output, HasSubstr("1 model(s) serving: no repository folder"));
  EXPECT_THAT(output, HasSubstr("; the embedded demo model"));
  EXPECT_THAT(output, HasSubstr("batch thread(s) shared by all models"));
  // The KV-cache budget, derived from this machine, and where it came from.
  ASSERT_TRUE(server->WaitForLine("decoding sessions (Decode):", kStartTimeout).has_value());
  EXPECT_THAT(server->Output(),
              ContainsRegex("KV cache budget [0-9]+ MiB \\(1/8 of (cgroup v2 memory.max|cgroup v1 "
                            "memory.limit_in_bytes|physical RAM) \\([0-9]+ MiB\\)\\)"));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
}

TEST_F(AttnserveBinaryTest, StartupSummarySaysAGivenKvCacheBudgetWasGiven) {
  std::unique_ptr<ChildProcess> server = StartServer({"--kv-cache-budget-mb", "64"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitForLine("decoding sessions (Decode):", kStartTimeout).has_value())
      << server->Output();
  EXPECT_THAT(server->Output(), HasSubstr("KV cache budget 64 MiB (--kv-cache-budget-mb)"));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
}

// Every connection is a file descriptor: a soft limit below the hard one is raised at start, and
// the log says so (the child inherits this test's lowered soft limit).
TEST_F(AttnserveBinaryTest, ALowOpenFileLimitIsRaisedToTheHardLimitAndLogged) {
  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  if (original.rlim_max <= 256) GTEST_SKIP() << "the hard limit leaves nothing to raise";
  rlimit lowered = original;
  lowered.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  std::unique_ptr<ChildProcess> server = StartServer({});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &original), 0);
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(server->Output(),
              HasSubstr(absl::StrCat("open-file limit raised from 256 to ", original.rlim_max)));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
}

// gRPC 1.51 closes its listener for good when accept() fails for lack of file descriptors
// (grpc/grpc#20418); the accept guard sheds the waiting connections instead. With a limit of 128
// descriptors, 300 silent connections reach it; once they are gone, a new client is served.
TEST_F(AttnserveBinaryTest, TheListenerStillAcceptsAfterAnEpisodeAtTheOpenFileLimit) {
  std::unique_ptr<ChildProcess> server =
      StartServer({}, {}, {"/usr/bin/prlimit", "--nofile=128:128", "--"});
  ASSERT_NE(server, nullptr);
  // Served before the episode too. Under ThreadSanitizer this first call also starts the
  // runtime's symbolizer while descriptors are free: started at the limit, it cannot run, and the
  // reports of gRPC's own accesses (tests/sanitizers/tsan.supp) would go unsuppressed.
  {
    grpc::ClientContext context;
    v1::ListModelsResponse models;
    ASSERT_TRUE(Stub()->ListModels(&context, v1::ListModelsRequest(), &models).ok());
  }
  std::vector<int> connections;
  for (int i = 0; i < 300; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port_));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // The kernel completes the handshake into the backlog whatever the server does; a full
    // backlog makes connect fail, which is fine: the limit is reached long before.
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd);
      continue;
    }
    connections.push_back(fd);
  }
  const std::optional<std::string> shed =
      server->WaitForLine("out of file descriptors", kStartTimeout);
  ASSERT_TRUE(shed.has_value()) << server->Output();
  EXPECT_THAT(*shed, HasSubstr("the listener keeps accepting"));
  for (int fd : connections) close(fd);

  // The server frees its ends as it sees the closes; a call waits for a connection meanwhile.
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListModelsResponse models;
  const grpc::Status status = Stub()->ListModels(&context, v1::ListModelsRequest(), &models);
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message() << "\n"
                           << server->Output();
  EXPECT_THAT(server->Output(), Not(HasSubstr("Failed accept4")));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
}

TEST_F(AttnserveBinaryTest, ConfigFileSetsFlagsAndTheCommandLineWins) {
  const std::filesystem::path config = temp_.path() / "attnserve.toml";
  std::ofstream(config) << "max-batch-sequences = 3\nmax-queue-size = 7\nlog-level = \"debug\"\n";
  std::unique_ptr<ChildProcess> server =
      StartServer({"--config", config.string(), "--max-queue-size", "9"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitForLine("threads:", kStartTimeout).has_value()) << server->Output();
  EXPECT_THAT(server->Output(), HasSubstr("max_batch_sequences=3"));
  EXPECT_THAT(server->Output(), HasSubstr("max_queue_size=9"));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
}

TEST_F(AttnserveBinaryTest, EnvironmentSetsFlagsAndTheCommandLineWins) {
  std::unique_ptr<ChildProcess> server = StartServer(
      {"--max-queue-size", "9"}, {"ATTNSERVE_MAX_BATCH_SEQUENCES=5", "ATTNSERVE_MAX_QUEUE_SIZE=7",
                                  "ATTNSERVE_MAX_CONNECTION_AGE_S=2.5"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitForLine("threads:", kStartTimeout).has_value()) << server->Output();
  EXPECT_THAT(server->Output(), HasSubstr("max_batch_sequences=5"));
  EXPECT_THAT(server->Output(), HasSubstr("max_queue_size=9"));
  EXPECT_THAT(server->Output(), HasSubstr("connections aged out after 2500 ms"));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
}

TEST_F(AttnserveBinaryTest, ABadEnvironmentValueExitsNonZeroNamingTheFlag) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
      "/usr/bin/env", {"ATTNSERVE_LOG_FORMAT=xml", ATTNSERVE_BINARY, "--model-repository",
                       (temp_.path() / "absent").string()});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_NE((*child)->Wait(absl::Seconds(60)), 0);
  EXPECT_THAT((*child)->Output(), HasSubstr("--log-format: xml"));
}

TEST_F(AttnserveBinaryTest, JsonLogLinesAreJsonObjects) {
  std::unique_ptr<ChildProcess> server = StartServer({"--log-format", "json"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitForLine("threads:", kStartTimeout).has_value()) << server->Output();
  server->Signal(SIGINT);
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
  const std::vector<std::string> lines = server->Lines();
  ASSERT_GE(lines.size(), 5u);
  for (const std::string& line : lines) {
    const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(parsed.is_object()) << line;
    EXPECT_TRUE(parsed.contains("time") && parsed.contains("level") && parsed.contains("msg"))
        << line;
  }
  EXPECT_THAT(server->Output(), HasSubstr(R"("msg":"SIGINT received)"));
}

TEST_F(AttnserveBinaryTest, ARequestTheServerFailsIsAnsweredAndLoggedAtWarn) {
  std::unique_ptr<ChildProcess> server = StartServer({});
  ASSERT_NE(server, nullptr);
  v1::AttendRequest request;
  request.set_request_id("too-big");
  request.mutable_input()->add_shape(4);
  request.mutable_input()->add_shape(512);
  // Finite, so it passes validation, but its attention scores overflow fp32.
  for (int j = 0; j < 4 * 512; ++j) request.mutable_input()->add_values(3e37f);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::AttendResponse response;
  const grpc::Status status = Stub()->Attend(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  const std::optional<std::string> logged =
      server->WaitForLine("request_id=too-big failed", kStartTimeout);
  ASSERT_TRUE(logged.has_value()) << server->Output();
  EXPECT_THAT(*logged, HasSubstr("warn"));
  EXPECT_THAT(*logged, HasSubstr("model=demo"));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
}

TEST_F(AttnserveBinaryTest, SigtermAnswersEveryAcceptedRequestThenExitsZero) {
  // Batches are held back a minute, so the requests are still queued when SIGTERM arrives.
  std::unique_ptr<ChildProcess> server =
      StartServer({"--max-queue-delay-us", "60000000", "--log-level", "debug"});
  ASSERT_NE(server, nullptr);
  std::unique_ptr<v1::AttentionService::Stub> stub = Stub();
  constexpr int kRequests = 6;
  std::vector<std::unique_ptr<AsyncCall>> calls;
  for (int i = 0; i < kRequests; ++i) {
    v1::AttendRequest request;
    request.set_request_id(absl::StrCat("r", i));
    request.mutable_input()->add_shape(4);
    request.mutable_input()->add_shape(512);
    for (int j = 0; j < 4 * 512; ++j) request.mutable_input()->add_values(0.001f * (j % 97));
    calls.push_back(
        std::make_unique<AsyncCall>(*stub, std::move(request), std::chrono::seconds(60)));
  }
  ASSERT_EQ(server->WaitForLines("queued model=demo", kRequests, kStartTimeout), kRequests)
      << server->Output();

  server->Signal(SIGTERM);
  for (const auto& call : calls) {
    ASSERT_TRUE(call->Wait());
    ASSERT_TRUE(call->status().ok()) << call->status().error_message();
    EXPECT_EQ(call->response().request_id(), call->request().request_id());
    EXPECT_EQ(call->response().timing().batch_sequences(), kRequests);
    EXPECT_EQ(call->response().output().values_size(), 4 * 512);
  }
  EXPECT_EQ(server->Wait(absl::Seconds(60)), 0) << server->Output();
  EXPECT_THAT(server->Output(), HasSubstr("SIGTERM received: draining"));
  EXPECT_THAT(server->Output(), HasSubstr("drained; exiting"));
}

}  // namespace
}  // namespace attnserve::testing
