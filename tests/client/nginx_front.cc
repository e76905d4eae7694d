#include "tests/client/nginx_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace attnserve::testing {
namespace {

constexpr char kListen[] = "listen 50051 ";
constexpr char kServer[] = "server attnserve:50051 ";

// A port free on 127.0.0.1 a moment ago (bound, then released for nginx to bind).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The shipped config with the listen port and the upstream's servers replaced.
absl::StatusOr<std::string> Adapt(const std::string& shipped, int port,
                                  const std::vector<std::string>& upstreams,
                                  const std::filesystem::path& secrets) {
  const size_t listen = shipped.find(kListen);
  const size_t server = shipped.find(kServer);
  if (listen == std::string::npos || server == std::string::npos ||
      shipped.find(kListen, listen + 1) != std::string::npos ||
      shipped.find(kServer, server + 1) != std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shipped nginx config must hold `", kListen, "` and `", kServer,
                     "<parameters>;` once each (the test replaces them)"));
  }
  if (!secrets.empty() && shipped.find("/run/secrets/") == std::string::npos) {
    return absl::FailedPreconditionError("the shipped nginx config names no /run/secrets/ file");
  }
  const size_t end = shipped.find(';', server);
  const std::string parameters =
      shipped.substr(server + sizeof(kServer) - 1, end - server - sizeof(kServer) + 1);
  std::string servers;
  for (const std::string& upstream : upstreams) {
    absl::StrAppend(&servers, "server ", upstream, " ", parameters, ";\n    ");
  }
  std::string adapted = shipped;
  adapted.replace(server, end + 1 - server, servers);
  adapted.replace(adapted.find(kListen), sizeof(kListen) - 1,
                  absl::StrCat("listen 127.0.0.1:", port, " "));
  if (secrets.empty()) return adapted;
  return absl::StrReplaceAll(adapted, {{"/run/secrets/", secrets.string() + "/"}});
}

}  // namespace

absl::StatusOr<std::unique_ptr<NginxFront>> NginxFront::Start(
    const std::string& nginx, const std::filesystem::path& shipped_config,
    const std::vector<std::string>& upstreams, const std::filesystem::path& folder,
    const std::filesystem::path& secrets) {
  if (nginx.empty() || access(nginx.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        "nginx not found: install it with deploy/install-deps.sh (Debian's nginx)");
  }
  absl::StatusOr<std::string> shipped = ReadFile(shipped_config);
  if (!shipped.ok()) return shipped.status();
  const std::string prefix = folder.string();
  // A port can be taken between FreePort() and nginx's bind: then nginx exits, and we retry.
  std::string log;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int port = FreePort();
    absl::StatusOr<std::string> config = Adapt(*shipped, port, upstreams, secrets);
    if (!config.ok()) return config.status();
    std::ofstream(folder / "attnserve.conf") << *config;
    std::ofstream(folder / "nginx.conf") << absl::StrReplaceAll(
        R"(daemon off;
worker_processes 1;
pid PREFIX/nginx.pid;
error_log stderr notice;
events { worker_connections 1024; }
http {
  client_body_temp_path PREFIX/client_body;
  proxy_temp_path PREFIX/proxy;
  fastcgi_temp_path PREFIX/fastcgi;
  uwsgi_temp_path PREFIX/uwsgi;
  scgi_temp_path PREFIX/scgi;
  include PREFIX/attnserve.conf;
}
)",
        {{"PREFIX", prefix}});
    absl::StatusOr<std::unique_ptr<ChildProcess>> process = ChildProcess::Start(
        nginx, {"-p", prefix + "/", "-e", "stderr", "-c", prefix + "/nginx.conf"});
    if (!process.ok()) return process.status();
    if ((*process)->WaitForLine("start worker process", absl::Seconds(10))) {
      return std::unique_ptr<NginxFront>(
          new NginxFront(*std::move(process), absl::StrCat("127.0.0.1:", port)));
    }
    (*process)->Signal(SIGKILL);
    (*process)->Wait(absl::Seconds(10));
    log = (*process)->Output();
    if (log.find("Address already in use") == std::string::npos) break;
  }
  return absl::InternalError(absl::StrCat("nginx did not start:\n", log));
}

NginxFront::~NginxFront() {
  // Not SIGKILL: the workers would outlive the master and keep the output pipe open.
  process_->Signal(SIGTERM);
  process_->Wait(absl::Seconds(10));
}

NginxFront::Retries NginxFront::TakeRetries() {
  const std::vector<std::string> lines = process_->Lines();
  Retries retries;
  for (; lines_seen_ < lines.size(); ++lines_seen_) {
    const std::string& line = lines[lines_seen_];
    const size_t at = line.find(" upstream=");
    if (at == std::string::npos) continue;
    ++retries.calls;
    const std::string addresses = line.substr(at, line.find(" upstream_status=") - at);
    retries.resent += static_cast<int>(std::count(addresses.begin(), addresses.end(), ','));
    // OK: HTTP 200 and gRPC status 0 in the trailers (the log format's `grpc_status=T/H`).
    if (line.find("\" 200 grpc_status=0/") == std::string::npos) ++retries.not_ok;
  }
  return retries;
}

}  // namespace attnserve::testing
