#include "server/metrics/metrics_exposer.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace attnserve::server::metrics {
namespace {

// Opens a TCP connection to host:port and closes it (errors are ignored: it only wakes a poll).
void ConnectAndHangUp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  const int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  if (fd >= 0) {
    (void)connect(fd, found->ai_addr, found->ai_addrlen);
    close(fd);
  }
  freeaddrinfo(found);
}

}  // namespace

constexpr int kHttpThreads = 4;
constexpr int kRequestTimeoutMs = 1000;

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(
    const std::string& address, const ServerMetrics& metrics) {
  const size_t colon = address.rfind(':');
  int requested_port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &requested_port) || requested_port < 0 ||
      requested_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics_address: expected host:port (e.g. 0.0.0.0:8002, port 0 = any free port) or \"\" "
        "for no metrics, got \"",
        address, "\""));
  }
  std::unique_ptr<MetricsExposer> exposer(new MetricsExposer());
  try {
    // prometheus-cpp reports a failed bind by throwing (CivetWeb): caught here, at the boundary.
    // A scrape takes a few milliseconds, but one client that sends half a request holds a
    // CivetWeb thread until the read times out (30 s by default): with several threads and a
    // short timeout, slow or hostile clients delay a scrape by at most kRequestTimeoutMs.
    exposer->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", std::to_string(kHttpThreads),
        "request_timeout_ms", std::to_string(kRequestTimeoutMs)});
  } catch (const std::exception& error) {
    return absl::UnavailableError(
        absl::StrCat("metrics_address: cannot listen on \"", address,
                     "\" (in use, or not an address of this machine): ", error.what()));
  }
  for (const std::shared_ptr<prometheus::Collectable>& collectable : metrics.Collectables()) {
    exposer->exposer_->RegisterCollectable(collectable);
  }
  const std::vector<int> ports = exposer->exposer_->GetListeningPorts();
  exposer->port_ = ports.empty() ? requested_port : ports.front();
  // Where a local connection reaches the listener: a wildcard address listens on loopback too.
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0" || host == "*") host = "127.0.0.1";
  if (host == "::") host = "::1";
  exposer->wake_host_ = host;
  return exposer;
}

MetricsExposer::~MetricsExposer() {
  // CivetWeb's mg_stop waits for its listening thread's poll() to time out, which takes up to 2 s.
  // A connection wakes the poll at once, so connect (and hang up) until the exposer is gone.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load()) {
      ConnectAndHangUp(wake_host_, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  exposer_.reset();
  stopped.store(true);
  waker.join();
}

}  // namespace attnserve::server::metrics
