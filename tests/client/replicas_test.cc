// Three attnserve replicas on 127.0.0.2, 127.0.0.3 and 127.0.0.4 (loopback, no other network)
// behind the C++ client's round_robin over an ipv4: target, with retries on, under steady load:
// SIGKILL of one replica, then a rolling SIGTERM restart of all three (each waiting for the
// previous to serve the client again). The client must see no failed call. Then the same faults
// through nginx (deploy/nginx/attnserve-grpc.conf) with the client's retries off. Calls, p99 and
// nginx's re-sent calls of each phase are printed (and recorded as test properties).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "attnserve/client/client.h"
#include "tests/client/nginx_front.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {
namespace {

namespace ac = ::attnserve::client;
constexpr absl::Duration kStartTimeout = absl::Seconds(60);

// One replica: attnserve on `host`, on a port chosen at first start and kept across restarts.
class Replica {
 public:
  Replica(std::string host, std::string repository, std::vector<std::string> extra_flags)
      : host_(std::move(host)),
        repository_(std::move(repository)),
        extra_flags_(std::move(extra_flags)) {}

  // Starts (or restarts) the server; false when it did not come up.
  bool Start() {
    std::vector<std::string> flags = {"--grpc-address",
                                      absl::StrCat(host_, ":", port_),
                                      "--metrics-address",
                                      "",
                                      "--http-address",
                                      "",
                                      "--model-repository",
                                      repository_,
                                      "--compute-threads",
                                      "1",
                                      "--shutdown-grace-s",
                                      "10",
                                      "--malloc-trim-interval-s",
                                      "0",
                                      "--log-level",
                                      "debug"};
    flags.insert(flags.end(), extra_flags_.begin(), extra_flags_.end());
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Start(ATTNSERVE_BINARY, flags);
    if (!child.ok()) return false;
    process_ = *std::move(child);
    std::optional<std::string> line = process_->WaitForLine("(port ", kStartTimeout);
    if (!line) return false;
    const size_t at = line->find("(port ") + 6;
    return absl::SimpleAtoi(line->substr(at, line->find(')', at) - at), &port_);
  }
  // Whether the client's calls reach this replica again (its debug log shows a queued request)
  // within 10 s. Serving by itself is not enough: the client reconnects to a replica it saw
  // refuse connections only after gRPC's reconnect backoff (1 s, growing), so a restart that
  // moved on at SERVING could take the last connected replica away and fail calls.
  bool AwaitTraffic() {
    return process_->WaitForLine("queued model=", absl::Seconds(10)).has_value();
  }
  // SIGTERM, and the exit code once drained.
  int Stop() {
    process_->Signal(SIGTERM);
    return process_->Wait(absl::Seconds(30));
  }
  void Kill() {
    process_->Signal(SIGKILL);
    process_->Wait(absl::Seconds(30));
  }
  std::string address() const { return absl::StrCat(host_, ":", port_); }

 private:
  const std::string host_;
  const std::string repository_;
  const std::vector<std::string> extra_flags_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

// Steady closed-loop load from `threads` threads until Stop(); latencies by phase.
class Load {
 public:
  Load(ac::Client* client, int threads) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, client] {
        const std::vector<float> input(4 * 512, 0.25f);
        // Bounded: at most 100000 calls per thread.
        for (int i = 0; i < 100000 && !stop_.load(); ++i) {
          const auto start = std::chrono::steady_clock::now();
          absl::Status status = client->Attend("", {input, {4, 512}}).status();
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
          std::lock_guard<std::mutex> lock(mu_);
          latencies_ms_.push_back(ms);
          if (!status.ok() && failures_++ == 0) first_failure_ = status.ToString();
        }
      });
    }
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_.store(true);
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }
  // Calls, failures and p99 since the last call of Phase().
  struct Phase {
    size_t calls = 0;
    int failures = 0;
    double p99_ms = 0;
    std::string first_failure;
  };
  Phase TakePhase() {
    std::lock_guard<std::mutex> lock(mu_);
    Phase phase{.calls = latencies_ms_.size(),
                .failures = failures_,
                .p99_ms = 0,
                .first_failure = first_failure_};
    if (!latencies_ms_.empty()) {
      std::sort(latencies_ms_.begin(), latencies_ms_.end());
      phase.p99_ms = latencies_ms_[latencies_ms_.size() * 99 / 100];
    }
    latencies_ms_.clear();
    failures_ = 0;
    first_failure_.clear();
    return phase;
  }
  size_t calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return latencies_ms_.size();
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<double> latencies_ms_;
  int failures_ = 0;
  std::string first_failure_;
  std::vector<std::thread> threads_;
};

// Waits (bounded, 10 s) until `load` made `more` calls from now.
void AwaitCalls(Load& load, size_t more) {
  const size_t until = load.calls() + more;
  for (int i = 0; i < 2000 && load.calls() < until; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Prints a phase and checks it failed no call; `extra` is printed after the calls and recorded
// as properties.
void Report(const std::string& name, const Load::Phase& phase,
            const std::vector<std::pair<std::string, int>>& extra = {}) {
  std::cout << name << ": calls=" << phase.calls << " failed=" << phase.failures;
  for (const auto& [key, value] : extra) {
    std::cout << " " << key << "=" << value;
    ::testing::Test::RecordProperty(absl::StrCat(name, "_", key), value);
  }
  std::cout << " p99_ms=" << phase.p99_ms << "\n";
  ::testing::Test::RecordProperty(absl::StrCat(name, "_calls"), static_cast<int>(phase.calls));
  ::testing::Test::RecordProperty(absl::StrCat(name, "_p99_us"),
                                  static_cast<int>(phase.p99_ms * 1000));
  EXPECT_EQ(phase.failures, 0) << name << ": " << phase.first_failure;
}

// The client options of both tests: retries on (UNAVAILABLE from a draining replica).
ac::ClientOptions RetryingClient() {
  ac::ClientOptions options;
  options.max_attempts = 5;
  options.initial_backoff = std::chrono::milliseconds(20);
  options.max_backoff = std::chrono::milliseconds(500);
  options.default_deadline = std::chrono::milliseconds(10000);
  return options;
}

// Three replicas on 127.0.0.2-4 (loopback), started with `extra_flags`; their repository absent
// (the demo model).
std::vector<std::unique_ptr<Replica>> StartReplicas(
    const TempFolder& temp, const std::vector<std::string>& extra_flags = {}) {
  const std::string repository = (temp.path() / "absent").string();
  std::vector<std::unique_ptr<Replica>> replicas;
  for (const char* host : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
    replicas.push_back(std::make_unique<Replica>(host, repository, extra_flags));
    EXPECT_TRUE(replicas.back()->Start()) << host;
  }
  return replicas;
}

// The faults, under `load`: steady state, (a) SIGKILL of one replica and its restart, (b) a
// rolling SIGTERM restart of all three; `report(phase name)` after each.
void SigkillThenRollingRestart(std::vector<std::unique_ptr<Replica>>& replicas, Load& load,
                               const std::function<void(const std::string&)>& report) {
  AwaitCalls(load, 200);
  report("steady");

  // (a) SIGKILL one replica; the other two carry on, then it comes back.
  replicas[1]->Kill();
  AwaitCalls(load, 200);
  ASSERT_TRUE(replicas[1]->Start());
  AwaitCalls(load, 200);
  report("sigkill");

  // (b) Rolling restart: SIGTERM (drain, exit 0), start again, wait until it serves, next.
  for (std::unique_ptr<Replica>& replica : replicas) {
    EXPECT_EQ(replica->Stop(), 0);
    AwaitCalls(load, 50);
    ASSERT_TRUE(replica->Start());
    EXPECT_TRUE(replica->AwaitTraffic()) << replica->address();
  }
  report("rolling_restart");
}

// (a) and (b): the client balances (round_robin over the three addresses) and retries.
TEST(ReplicasTest, KillAndRollingRestartUnderLoadFailNoCall) {
  TempFolder temp;
  std::vector<std::unique_ptr<Replica>> replicas = StartReplicas(temp);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::string target = "ipv4:";
  for (const std::unique_ptr<Replica>& replica : replicas) {
    absl::StrAppend(&target, target.size() > 5 ? "," : "", replica->address());
  }
  absl::StatusOr<std::unique_ptr<ac::Client>> client = ac::Client::Create(target, RetryingClient());
  ASSERT_TRUE(client.ok()) << client.status();

  Load load(client->get(), 2);
  SigkillThenRollingRestart(replicas, load,
                            [&](const std::string& name) { Report(name, load.TakePhase()); });
  load.Stop();
}

// (c) The same faults through nginx (deploy/nginx/attnserve-grpc.conf, as shipped but for its
// listen port and upstream addresses); the client has one address, nginx's. nginx sends calls
// a refusing replica would not take to another one (grpc_next_upstream) and leaves it out for a
// while (max_fails); calls lost in a killed replica (502) and a draining replica's UNAVAILABLE
// reach the client, whose retry policy re-sends them through nginx to a live replica.
TEST(ReplicasTest, ThroughNginxKillAndRollingRestartFailNoCall) {
  TempFolder temp;
  std::vector<std::unique_ptr<Replica>> replicas = StartReplicas(temp);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::vector<std::string> upstreams;
  for (const std::unique_ptr<Replica>& replica : replicas) upstreams.push_back(replica->address());
  std::filesystem::create_directory(temp.path() / "nginx");
  absl::StatusOr<std::unique_ptr<NginxFront>> nginx =
      NginxFront::Start(ATTNSERVE_NGINX, ATTNSERVE_NGINX_CONFIG, upstreams, temp.path() / "nginx");
  ASSERT_TRUE(nginx.ok()) << nginx.status();

  absl::StatusOr<std::unique_ptr<ac::Client>> client =
      ac::Client::Create((*nginx)->address(), RetryingClient());
  ASSERT_TRUE(client.ok()) << client.status();

  Load load(client->get(), 2);
  SigkillThenRollingRestart(replicas, load, [&](const std::string& name) {
    // Access-log lines still in the pipe count towards the next phase (a report, not a check).
    const NginxFront::Retries retries = (*nginx)->TakeRetries();
    Report(absl::StrCat("nginx_", name), load.TakePhase(),
           {{"nginx_resent", retries.resent}, {"client_retried", retries.not_ok}});
  });
  load.Stop();
  if (const char* path = std::getenv("ATTNSERVE_NGINX_LOG")) std::ofstream(path) << (*nginx)->Log();
}

// deploy/nginx/attnserve-grpc-tls.conf as shipped (compose.tls.yaml's): clients reach nginx over
// TLS, nginx reaches replicas that require client certificates over mutual TLS, checking theirs.
// Certificates by deploy/make-test-certs.sh, under the names compose's secrets give them.
TEST(ReplicasTest, ThroughNginxWithMutualTls) {
  TempFolder temp;
  const std::filesystem::path certs = temp.path() / "certs";
  const std::string command = absl::StrCat(MAKE_TEST_CERTS, " ", certs.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const std::filesystem::path secrets = temp.path() / "secrets";
  std::filesystem::create_directory(secrets);
  for (const auto& [name, file] : std::vector<std::pair<std::string, std::string>>{
           {"attnserve-tls-cert", "server.pem"},
           {"attnserve-tls-key", "server.key"},
           {"attnserve-tls-ca", "ca.pem"},
           {"attnserve-tls-client-cert", "client.pem"},
           {"attnserve-tls-client-key", "client.key"}}) {
    std::filesystem::create_symlink(certs / file, secrets / name);
  }
  std::vector<std::unique_ptr<Replica>> replicas = StartReplicas(
      temp, {"--tls-cert-chain", (certs / "server.pem").string(), "--tls-private-key",
             (certs / "server.key").string(), "--tls-client-ca", (certs / "ca.pem").string()});
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::vector<std::string> upstreams;
  for (const std::unique_ptr<Replica>& replica : replicas) upstreams.push_back(replica->address());
  std::filesystem::create_directory(temp.path() / "nginx");
  absl::StatusOr<std::unique_ptr<NginxFront>> nginx = NginxFront::Start(
      ATTNSERVE_NGINX, ATTNSERVE_NGINX_TLS_CONFIG, upstreams, temp.path() / "nginx", secrets);
  ASSERT_TRUE(nginx.ok()) << nginx.status();

  ac::ClientOptions options = RetryingClient();
  options.max_attempts = 1;  // every call must succeed at once
  options.tls_ca_path = (certs / "ca.pem").string();
  absl::StatusOr<std::unique_ptr<ac::Client>> client =
      ac::Client::Create((*nginx)->address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  Load load(client->get(), 2);
  AwaitCalls(load, 300);
  load.Stop();
  const NginxFront::Retries retries = (*nginx)->TakeRetries();
  const Load::Phase phase = load.TakePhase();
  Report("nginx_mtls", phase, {{"nginx_resent", retries.resent}});
  EXPECT_GE(phase.calls, 300u);
  // Every replica answered some: nginx balanced the calls over all three mTLS connections.
  for (const std::unique_ptr<Replica>& replica : replicas) {
    EXPECT_TRUE(replica->AwaitTraffic()) << replica->address();
  }
  // A client without the CA is refused by nginx's TLS: the front really is TLS.
  ac::ClientOptions plaintext = options;
  plaintext.tls_ca_path.clear();
  absl::StatusOr<std::unique_ptr<ac::Client>> refused =
      ac::Client::Create((*nginx)->address(), plaintext);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE((*refused)->Attend("", {std::vector<float>(512, 1.0f), {1, 512}}).ok());
}

}  // namespace
}  // namespace attnserve::testing
