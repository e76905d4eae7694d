// TLS and mutual TLS on the attnserve binary's gRPC port, with certificates made by openssl at
// test time (deploy/make-test-certs.sh): what succeeds, how each misconfiguration fails for the
// client (status) and in the server's log, and certificate rotation under load without a failed
// call.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "attnserve/client/client.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing::tls_test {
namespace {

namespace fs = std::filesystem;
namespace ac = ::attnserve::client;
using ::testing::HasSubstr;

constexpr absl::Duration kStartTimeout = absl::Seconds(60);

// Standard output of a shell command (for the openssl CLI).
std::string Shell(const std::string& command) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  pclose(pipe);
  return output;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new TempFolder("attnserve-tls");
    const std::string command = absl::StrCat(MAKE_TEST_CERTS, " ", certs_->path().string());
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }
  static std::string Cert(const std::string& name) { return (certs_->path() / name).string(); }

  // Starts attnserve on 127.0.0.1 (ephemeral port) serving `cert`.pem/.key, with mutual TLS when
  // `client_ca` is set; null on failure.
  std::unique_ptr<ChildProcess> StartServer(const std::string& cert_chain, const std::string& key,
                                            const std::string& client_ca = "") {
    std::vector<std::string> args = {"--grpc-address",           "127.0.0.1:0",
                                     "--http-address",           "127.0.0.1:0",
                                     "--metrics-address",        "",
                                     "--compute-threads",        "1",
                                     "--model-repository",       (temp_.path() / "absent").string(),
                                     "--tls-cert-chain",         cert_chain,
                                     "--tls-private-key",        key,
                                     "--tls-refresh-interval-s", "1"};
    if (!client_ca.empty()) args.insert(args.end(), {"--tls-client-ca", client_ca});
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Start(ATTNSERVE_BINARY, args);
    EXPECT_TRUE(child.ok()) << child.status();
    if (!child.ok()) return nullptr;
    std::optional<std::string> listening = (*child)->WaitForLine("(port ", kStartTimeout);
    EXPECT_TRUE(listening.has_value()) << (*child)->Output();
    if (!listening) return nullptr;
    const size_t at = listening->find("(port ") + 6;
    EXPECT_TRUE(absl::SimpleAtoi(listening->substr(at, listening->find(')', at) - at), &port_));
    return *std::move(child);
  }
  std::unique_ptr<ChildProcess> StartServer(const std::string& name) {
    return StartServer(Cert(name + ".pem"), Cert(name + ".key"));
  }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }

  // One Attend of a [2, 512] input to the demo model, one attempt, short deadline.
  absl::Status AttendOnce(ac::ClientOptions options) {
    options.max_attempts = 1;
    options.default_deadline = std::chrono::milliseconds(5000);
    absl::StatusOr<std::unique_ptr<ac::Client>> client = ac::Client::Create(target(), options);
    if (!client.ok()) return client.status();
    const std::vector<float> input(2 * 512, 0.5f);
    return (*client)->Attend("", {input, {2, 512}}).status();
  }

  static ac::ClientOptions Trusting(const std::string& ca = "ca.pem") {
    ac::ClientOptions options;
    options.tls_ca_path = Cert(ca);
    return options;
  }

  static TempFolder* certs_;
  TempFolder temp_;
  int port_ = 0;
};

TempFolder* TlsTest::certs_ = nullptr;

TEST_F(TlsTest, ATlsCallSucceedsAndTheLogSaysWhatIsServed) {
  std::unique_ptr<ChildProcess> server = StartServer("server");
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(AttendOnce(Trusting()).ok()) << server->Output();
  EXPECT_TRUE(server->WaitForLine("gRPC port security: TLS (cert", absl::Seconds(10)));
  EXPECT_TRUE(server->WaitForLine("names DNS:localhost, IP:127.0.0.1", absl::Seconds(10)));
}

TEST_F(TlsTest, APlaintextClientIsRefusedAndTheServerLogsWhy) {
  std::unique_ptr<ChildProcess> server = StartServer("server");
  ASSERT_NE(server, nullptr);
  const absl::Status status = AttendOnce({});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(server->WaitForLine("wrong version number", absl::Seconds(10))) << server->Output();
}

TEST_F(TlsTest, AServerCertificateFromAnotherCaIsRefused) {
  std::unique_ptr<ChildProcess> server = StartServer("server-untrusted");
  ASSERT_NE(server, nullptr);
  const absl::Status status = AttendOnce(Trusting());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("certificate verify failed"));
  EXPECT_TRUE(server->WaitForLine("issuer CN=attnserve-untrusted-ca", absl::Seconds(10)));
}

TEST_F(TlsTest, AnExpiredServerCertificateIsRefusedAndTheServerWarns) {
  std::unique_ptr<ChildProcess> server = StartServer("server-expired");
  ASSERT_NE(server, nullptr);
  const absl::Status status = AttendOnce(Trusting());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("certificate verify failed"));
  std::optional<std::string> line = server->WaitForLine("EXPIRED", absl::Seconds(10));
  ASSERT_TRUE(line.has_value()) << server->Output();
  EXPECT_THAT(*line, HasSubstr("warn"));
}

TEST_F(TlsTest, ANotYetValidServerCertificateIsRefusedAndTheServerWarns) {
  std::unique_ptr<ChildProcess> server = StartServer("server-future");
  ASSERT_NE(server, nullptr);
  const absl::Status status = AttendOnce(Trusting());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("certificate verify failed"));
  EXPECT_TRUE(server->WaitForLine("NOT YET VALID", absl::Seconds(10))) << server->Output();
}

TEST_F(TlsTest, ACertificateForAnotherHostNameIsRefused) {
  std::unique_ptr<ChildProcess> server = StartServer("server-wrongname");
  ASSERT_NE(server, nullptr);
  const absl::Status status = AttendOnce(Trusting());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("Peer name 127.0.0.1 is not in peer certificate"));
  EXPECT_TRUE(server->WaitForLine("names DNS:wrong.example,", absl::Seconds(10)));
  // The same certificate is accepted when the client asks for the name it carries.
  ac::ClientOptions options = Trusting();
  options.tls_server_name = "wrong.example";
  EXPECT_TRUE(AttendOnce(options).ok());
}

TEST_F(TlsTest, MutualTlsAcceptsOnlyClientsWithATrustedCertificate) {
  std::unique_ptr<ChildProcess> server =
      StartServer(Cert("server.pem"), Cert("server.key"), Cert("ca.pem"));
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->WaitForLine("gRPC port security: mutual TLS", absl::Seconds(10)));

  absl::Status status = AttendOnce(Trusting());  // No client certificate.
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(server->WaitForLine("peer did not return a certificate", absl::Seconds(10)))
      << server->Output();

  ac::ClientOptions untrusted = Trusting();
  untrusted.tls_cert_chain_path = Cert("client-untrusted.pem");
  untrusted.tls_private_key_path = Cert("client-untrusted.key");
  status = AttendOnce(untrusted);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(server->WaitForLine("certificate verify failed", absl::Seconds(10)))
      << server->Output();

  ac::ClientOptions trusted = Trusting();
  trusted.tls_cert_chain_path = Cert("client.pem");
  trusted.tls_private_key_path = Cert("client.key");
  status = AttendOnce(trusted);
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(TlsTest, BadTlsFlagsStopTheServerWithTheReason) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
      ATTNSERVE_BINARY, {"--grpc-address", "127.0.0.1:0", "--http-address", "", "--metrics-address",
                         "", "--tls-cert-chain", Cert("server.pem")});
  ASSERT_TRUE(child.ok());
  EXPECT_NE((*child)->Wait(absl::Seconds(60)), 0);
  EXPECT_THAT((*child)->Output(), HasSubstr("tls_cert_chain, tls_private_key: expected both"));
}

// The serial number of the certificate the server on `port` presents now, read with
// `openssl s_client` (a fresh handshake).
std::string PresentedSerial(int port, const std::string& ca) {
  return Shell(absl::StrCat("openssl s_client -connect 127.0.0.1:", port, " -alpn h2 -CAfile ", ca,
                            " </dev/null 2>/dev/null | openssl x509 -noout -serial"));
}

// Kubernetes-style rotation: the server reads current/tls.crt and current/tls.key where current
// is a symlink to a folder, and the Secret update swaps the symlink atomically. A client calling
// all along, on its connection and on new ones, sees no failure; new handshakes get the new
// certificate.
TEST_F(TlsTest, RotationIsPickedUpWhileAClientKeepsCalling) {
  const fs::path dir = temp_.path();
  for (const auto& [folder, name] : {std::pair{"v1", "server"}, std::pair{"v2", "server2"}}) {
    fs::create_directories(dir / folder);
    fs::copy_file(Cert(absl::StrCat(name, ".pem")), dir / folder / "tls.crt");
    fs::copy_file(Cert(absl::StrCat(name, ".key")), dir / folder / "tls.key");
  }
  fs::create_directory_symlink("v1", dir / "current");
  std::unique_ptr<ChildProcess> server =
      StartServer((dir / "current" / "tls.crt").string(), (dir / "current" / "tls.key").string());
  ASSERT_NE(server, nullptr);
  const std::string old_serial = PresentedSerial(port_, Cert("ca.pem"));
  const std::string new_serial =
      Shell(absl::StrCat("openssl x509 -noout -serial -in ", Cert("server2.pem")));
  ASSERT_THAT(old_serial, HasSubstr("serial="));
  ASSERT_NE(old_serial, new_serial);

  std::atomic<bool> stop{false};
  std::atomic<int> calls{0}, failures{0};
  std::string first_failure;
  std::thread caller([&] {
    absl::StatusOr<std::unique_ptr<ac::Client>> steady = ac::Client::Create(target(), Trusting());
    const std::vector<float> input(2 * 512, 0.5f);
    // Bounded: at most 3000 calls; every 10th on a new connection (a new handshake).
    for (int i = 0; i < 3000 && !stop.load(); ++i) {
      absl::Status status =
          i % 10 == 0 ? AttendOnce(Trusting()) : (*steady)->Attend("", {input, {2, 512}}).status();
      calls.fetch_add(1);
      if (!status.ok() && failures.fetch_add(1) == 0) first_failure = status.ToString();
    }
  });
  while (calls.load() < 20 && !stop.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  fs::create_directory_symlink("v2", dir / "current.new");
  fs::rename(dir / "current.new", dir / "current");
  const int calls_at_rotation = calls.load();

  // gRPC's file watcher checks every second: poll (bounded) until new handshakes get server2.
  std::string serial;
  for (int i = 0; i < 40 && serial != new_serial; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    serial = PresentedSerial(port_, Cert("ca.pem"));
  }
  const int wait_for = calls.load() + 20;
  while (calls.load() < wait_for && calls.load() < 3000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop.store(true);
  caller.join();

  EXPECT_EQ(serial, new_serial) << "new handshakes still get the old certificate";
  EXPECT_TRUE(server->WaitForLine("changed, now serving", absl::Seconds(5))) << server->Output();
  EXPECT_EQ(failures.load(), 0) << first_failure;
  EXPECT_GT(calls.load(), calls_at_rotation + 20);
}

// An operator's in-place rewrites of each TLS file while a client keeps calling: `cp` over it
// (truncate, then write), a truncation, a partial write, garbage, a mismatched key, a deletion,
// 200 times per file, some held for two refresh intervals so that every bad content is seen
// and reported. gRPC's own watcher would hand an empty file on and abort the process; the server
// keeps the last good set, refuses nothing, and counts what it rejected.
TEST_F(TlsTest, RewritingEveryFileInPlaceUnderLoadNeverStopsTheServer) {
  const fs::path dir = temp_.path();
  const fs::path chain = dir / "server.pem", key = dir / "server.key", ca = dir / "ca.pem";
  fs::copy_file(Cert("server.pem"), chain);
  fs::copy_file(Cert("server.key"), key);
  fs::copy_file(Cert("ca.pem"), ca);
  std::unique_ptr<ChildProcess> server = StartServer(chain.string(), key.string(), ca.string());
  ASSERT_NE(server, nullptr);
  ac::ClientOptions mutual = Trusting();
  mutual.tls_cert_chain_path = Cert("client.pem");
  mutual.tls_private_key_path = Cert("client.key");

  std::atomic<bool> stop{false};
  std::atomic<int> calls{0}, failures{0};
  std::string first_failure;
  std::thread caller([&] {
    absl::StatusOr<std::unique_ptr<ac::Client>> steady = ac::Client::Create(target(), mutual);
    const std::vector<float> input(2 * 512, 0.5f);
    for (int i = 0; i < 20000 && !stop.load(); ++i) {
      absl::Status status =
          i % 10 == 0 ? AttendOnce(mutual) : (*steady)->Attend("", {input, {2, 512}}).status();
      calls.fetch_add(1);
      if (!status.ok() && failures.fetch_add(1) == 0) first_failure = status.ToString();
    }
  });
  auto write = [](const fs::path& path, const std::string& contents) {
    FILE* file = std::fopen(path.c_str(), "w");  // Truncates in place, as cp does.
    ASSERT_NE(file, nullptr);
    std::fwrite(contents.data(), 1, contents.size(), file);
    std::fclose(file);
  };
  auto read = [](const std::string& path) {
    std::string text;
    FILE* file = std::fopen(path.c_str(), "r");
    char buffer[4096];
    for (size_t n = 0; file != nullptr && (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;)
      text.append(buffer, n);
    if (file != nullptr) std::fclose(file);
    return text;
  };
  for (const auto& [path, good, other] :
       {std::tuple{chain, read(Cert("server.pem")), read(Cert("server2.pem"))},
        std::tuple{key, read(Cert("server.key")), read(Cert("server2.key"))},
        std::tuple{ca, read(Cert("ca.pem")), read(Cert("other-ca.key"))}}) {
    const std::vector<std::string> bad = {"", good.substr(0, good.size() / 2), "garbage\n", other};
    for (int i = 0; i < 200; ++i) {
      if (i % 100 == 0) {
        // Held for two 1 s refresh intervals and more: gRPC's watcher would read it, and the
        // server reports it (once two checks in a row see it).
        write(path, bad[static_cast<size_t>(i / 100)]);
        std::this_thread::sleep_for(std::chrono::milliseconds(2300));
      } else if (i == 150) {
        fs::remove(path);
        std::this_thread::sleep_for(std::chrono::milliseconds(2300));
      } else {
        write(path, bad[static_cast<size_t>(i) % bad.size()]);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      write(path, good);
    }
  }
  const int calls_at_end = calls.load();
  while (calls.load() < calls_at_end + 20 && calls.load() < 20000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop.store(true);
  caller.join();

  EXPECT_EQ(server->Wait(absl::Milliseconds(100)), -1) << "the server exited\n" << server->Output();
  EXPECT_TRUE(AttendOnce(mutual).ok());
  EXPECT_EQ(failures.load(), 0) << first_failure;
  EXPECT_GT(calls.load(), 100);
  EXPECT_GE(server->WaitForLines("TLS files rejected, the last good set keeps serving", 3,
                                 absl::Seconds(1)),
            3)
      << server->Output();
}

}  // namespace
}  // namespace attnserve::testing::tls_test
