// NginxFront: Debian's nginx as a child process, running the shipped gRPC load-balancer
// configuration (deploy/nginx/attnserve-grpc.conf) in front of given replicas, for tests.
//
// The shipped file is used as it is except for two lines: its `listen 50051 ...` port becomes
// 127.0.0.1 on a free port, and its upstream `server attnserve:50051 <parameters>;` becomes one
// such line per replica address, keeping the parameters; and the TLS variant's compose secrets
// folder, /run/secrets/, becomes a given folder. A main nginx.conf of the test's own (daemon off,
// pid, error log and temp paths in the given folder) includes it.
//
// Thread-safe as ChildProcess is.
#ifndef ATTNSERVE_TESTS_CLIENT_NGINX_FRONT_H_
#define ATTNSERVE_TESTS_CLIENT_NGINX_FRONT_H_

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/support/child_process.h"

namespace attnserve::testing {

class NginxFront {
 public:
  // Starts `nginx` (the binary's path) with `shipped_config` in front of `upstreams`
  // ("host:port" each), files under `folder`, /run/secrets/ replaced by `secrets` (when not
  // empty). FailedPrecondition when the config no longer has the two lines to replace; Internal
  // when nginx cannot start (its log in the message).
  static absl::StatusOr<std::unique_ptr<NginxFront>> Start(
      const std::string& nginx, const std::filesystem::path& shipped_config,
      const std::vector<std::string>& upstreams, const std::filesystem::path& folder,
      const std::filesystem::path& secrets = {});

  // Stops nginx (SIGTERM: its workers exit with it) and waits for it.
  ~NginxFront();

  // Where clients connect: "127.0.0.1:<port>".
  const std::string& address() const { return address_; }
  // From nginx's access log (its standard output), since the last call of TakeRetries(): the
  // calls it logged, the attempts it re-sent to another replica (an address per attempt in
  // `upstream=`), and the calls it answered other than HTTP 200 with gRPC status 0: a dead
  // replica's lost calls (502) and a draining replica's refusals (gRPC status 14), each of which
  // a retrying client re-sends.
  struct Retries {
    int calls = 0;
    int resent = 0;
    int not_ok = 0;
  };
  Retries TakeRetries();
  // Everything nginx printed: its error log (notice level) and access log.
  std::string Log() const { return process_->Output(); }

 private:
  NginxFront(std::unique_ptr<ChildProcess> process, std::string address)
      : process_(std::move(process)), address_(std::move(address)) {}

  std::unique_ptr<ChildProcess> process_;
  const std::string address_;
  size_t lines_seen_ = 0;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_CLIENT_NGINX_FRONT_H_
