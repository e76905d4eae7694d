#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/util/echo.h"
#include "httplib.h"
#include "server/conversion/oip_rest/rest_conversion.h"
#include "server/http/https_certificates.h"
#include "spdlog/spdlog.h"

namespace attnserve::server::http {
namespace {

// httplib's task queue with a bound: `threads` workers, at most `max_queued` connections
// waiting. enqueue, called on the accepting thread, blocks while the queue is full, so that the
// server stops accepting instead of holding any number of idle sockets.
class BoundedThreadPool final : public httplib::TaskQueue {
 public:
  BoundedThreadPool(int threads, int max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~BoundedThreadPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [this] { return stopping_ || static_cast<int>(jobs_.size()) < max_queued_; });
    jobs_.push_back(std::move(fn));
    work_.notify_one();
  }

  // Runs what is queued, then joins the workers.
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    work_.notify_all();
    space_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // Stopping, and nothing left.
        job = std::move(jobs_.front());
        jobs_.pop_front();
        space_.notify_one();
      }
      job();
    }
  }

  const int max_queued_;
  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable space_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

void Send(HttpReply reply, httplib::Response& res) {
  res.status = reply.status;
  res.set_header("Content-Type", reply.content_type);
  if (reply.json_length) {
    res.set_header(oip_rest::kHeaderLengthHeader, absl::StrCat(*reply.json_length));
  }
  res.body = std::move(reply.body);
}

// The model and version captured by a route's pattern.
std::string Capture(const httplib::Request& req, size_t index) {
  return index < req.matches.size() ? req.matches[index].str() : std::string();
}

constexpr char kModelPath[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

absl::StatusOr<std::pair<std::string, int>> SplitAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_address: expected host:port (e.g. 0.0.0.0:8000), got \"",
                     EchoForMessage(address), "\""));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::pair{host, port};
}

}  // namespace

struct HttpServer::Impl {
  std::unique_ptr<HttpsCertificates> certificates;  // Null for plaintext.
  std::unique_ptr<httplib::Server> server;
  std::thread listener;
  std::once_flag stop_once;
};

absl::Status ValidateHttpServerOptions(const HttpServerOptions& options) {
  if (auto address = SplitAddress(options.address); !address.ok()) return address.status();
  for (const auto& [name, value, minimum] :
       {std::tuple<const char*, int64_t, int64_t>{"http_threads", options.threads, 1},
        {"http_max_queued_connections", options.max_queued_connections, 1},
        {"http_max_body_bytes", options.max_body_bytes, 1},
        {"http_read_timeout_ms", options.read_timeout_ms, 1},
        {"http_write_timeout_ms", options.write_timeout_ms, 1},
        {"http_keep_alive_timeout_s", options.keep_alive_timeout_s, 1},
        {"http_keep_alive_max_requests", options.keep_alive_max_requests, 1}}) {
    if (value < minimum) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected >= ", minimum, ", got ", value));
    }
  }
  return absl::OkStatus();
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

namespace {

void AddRoutes(RestService* service, httplib::Server& server) {
  server.Get(R"(/v2/?)", [service](const httplib::Request&, httplib::Response& res) {
    Send(service->ServerMetadata(), res);
  });
  server.Get("/v2/health/live", [service](const httplib::Request&, httplib::Response& res) {
    Send(service->Live(), res);
  });
  server.Get("/v2/health/ready", [service](const httplib::Request&, httplib::Response& res) {
    Send(service->Ready(), res);
  });
  server.Get(kModelPath, [service](const httplib::Request& req, httplib::Response& res) {
    Send(service->ModelMetadata(Capture(req, 1), Capture(req, 2)), res);
  });
  server.Get(absl::StrCat(kModelPath, "/ready"),
             [service](const httplib::Request& req, httplib::Response& res) {
               Send(service->ModelReady(Capture(req, 1), Capture(req, 2)), res);
             });
  server.Post(absl::StrCat(kModelPath, "/infer"), [service](const httplib::Request& req,
                                                            httplib::Response& res) {
    const bool has_length = req.has_header(oip_rest::kHeaderLengthHeader);
    const std::string length =
        has_length ? req.get_header_value(oip_rest::kHeaderLengthHeader) : "";
    Send(service->Infer(Capture(req, 1), Capture(req, 2), req.body, has_length ? &length : nullptr),
         res);
  });
  // The other method on each path: 405 rather than "not found".
  const auto wrong_method = [](std::string_view allowed) {
    return [allowed = std::string(allowed)](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allowed);
      Send({.status = 405,
            .body =
                oip_rest::ErrorJson(absl::StrCat("method: expected ", allowed, " for ",
                                                 EchoForMessage(req.path), ", got ", req.method))},
           res);
    };
  };
  for (const std::string& path :
       {std::string(R"(/v2/?)"), std::string("/v2/health/live"), std::string("/v2/health/ready"),
        std::string(kModelPath), absl::StrCat(kModelPath, "/ready")}) {
    server.Post(path, wrong_method("GET"));
    server.Put(path, wrong_method("GET"));
    server.Patch(path, wrong_method("GET"));
    server.Delete(path, wrong_method("GET"));
    server.Options(path, wrong_method("GET"));
  }
  const std::string infer = absl::StrCat(kModelPath, "/infer");
  server.Get(infer, wrong_method("POST"));
  server.Put(infer, wrong_method("POST"));
  server.Patch(infer, wrong_method("POST"));
  server.Delete(infer, wrong_method("POST"));
  server.Options(infer, wrong_method("POST"));
}

// The socket `req` came on, found among the process's sockets by its two ports; -1 if none.
int ConnectionOf(const httplib::Request& req) {
  if (req.remote_port <= 0 || req.local_port <= 0) return -1;
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return -1;
  const auto port = [](const sockaddr_storage& address) {
    if (address.ss_family == AF_INET) {
      return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port));
    }
    if (address.ss_family == AF_INET6) {
      return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port));
    }
    return -1;
  };
  int found = -1;
  while (dirent* entry = readdir(fds)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(fds)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_size = sizeof(local), peer_size = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) == 0 &&
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) == 0 &&
        port(local) == req.local_port && port(peer) == req.remote_port) {
      found = fd;
      break;
    }
  }
  closedir(fds);
  return found;
}

// Answers `status` with `body` on `req`'s plaintext connection itself and ends it, for an error
// after which the rest of what the client sent cannot be trusted to start a request (a body
// refused unread, one cut off by the read timeout): httplib would keep the connection alive and
// read those bytes as the next request. The answer goes out, then the write side closes, and
// what the client still sends is read and dropped for at most kLingerMs (so that closing with
// unread bytes does not reset the connection before the client has read the answer); httplib's
// own write then fails and it closes the socket. False (httplib answers as usual) when the
// connection cannot be found.
constexpr int kLingerMs = 500;

bool AnswerAndClose(const httplib::Request& req, int status, const std::string& body) {
  const int fd = ConnectionOf(req);
  if (fd < 0) return false;
  const std::string answer =
      absl::StrCat("HTTP/1.1 ", status, status == 413 ? " Payload Too Large" : " Bad Request",
                   "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                   "\r\nConnection: close\r\n\r\n", body);
  for (size_t sent = 0; sent < answer.size();) {
    const ssize_t n = send(fd, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLingerMs);
  char sink[16384];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd readable{.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&readable, 1, static_cast<int>(left.count())) <= 0) break;
    if (recv(fd, sink, sizeof(sink), 0) <= 0) break;
  }
  shutdown(fd, SHUT_RD);
  return true;
}

// Bodies for the errors httplib answers by itself (no route, too large, malformed request).
httplib::Server::HandlerResponse ErrorBody(int64_t max_body_bytes, bool https,
                                           const httplib::Request& req, httplib::Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  std::string message;
  switch (res.status) {
    case 404:
      message = absl::StrCat("path: expected /v2, /v2/health/live, /v2/health/ready or ",
                             "/v2/models/{name}[/versions/{version}][/ready|/infer], got \"",
                             EchoForMessage(req.path), "\"");
      break;
    case 413:
      message = absl::StrCat("request body: expected at most ", max_body_bytes, " bytes");
      // The body was not read: the connection ends with this answer. (Over HTTPS the bytes on
      // the socket are TLS records, which only the session can write; the connection then stays
      // until the keep-alive timeout, and the refused body's bytes fail as a request.)
      if (!https && AnswerAndClose(req, res.status, oip_rest::ErrorJson(message))) {
        return httplib::Server::HandlerResponse::Handled;
      }
      res.set_header("Connection", "close");
      break;
    case 414:
      message = "path: expected at most 8192 bytes";
      break;
    default:
      message = absl::StrCat("request: refused with HTTP status ", res.status,
                             " (a malformed request line or header, a header line past 8 KiB, or "
                             "a request not received within the read timeout)");
      // Whatever follows on this connection cannot be trusted to start a request. (When the
      // request line or headers were bad, httplib tells nothing of the connection, which then
      // stays until the keep-alive timeout.)
      res.set_header("Connection", "close");
      if (!https && AnswerAndClose(req, res.status, oip_rest::ErrorJson(message))) {
        return httplib::Server::HandlerResponse::Handled;
      }
  }
  res.set_header("Content-Type", "application/json");
  res.body = oip_rest::ErrorJson(message);
  return httplib::Server::HandlerResponse::Handled;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              RestService* service,
                                                              const HttpsFiles* https) {
  if (absl::Status valid = ValidateHttpServerOptions(options); !valid.ok()) return valid;
  absl::StatusOr<std::pair<std::string, int>> address = SplitAddress(options.address);
  if (!address.ok()) return address.status();
  auto impl = std::make_unique<Impl>();
  if (https != nullptr) {
    absl::StatusOr<std::unique_ptr<HttpsCertificates>> certificates =
        HttpsCertificates::Load(*https);
    if (!certificates.ok()) return certificates.status();
    impl->certificates = *std::move(certificates);
    impl->server = std::make_unique<httplib::SSLServer>(
        [certificates = impl->certificates.get()](SSL_CTX& ctx) {
          return certificates->Configure(&ctx);
        });
    if (!impl->server->is_valid()) {
      return absl::InternalError("http_address: cannot set up HTTPS (OpenSSL refused the context)");
    }
  } else {
    impl->server = std::make_unique<httplib::Server>();
  }
  httplib::Server& server = *impl->server;
  server.new_task_queue = [threads = options.threads, queued = options.max_queued_connections] {
    return new BoundedThreadPool(threads, queued);
  };
  server.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  server.set_read_timeout(std::chrono::milliseconds(options.read_timeout_ms));
  server.set_write_timeout(std::chrono::milliseconds(options.write_timeout_ms));
  server.set_keep_alive_timeout(static_cast<time_t>(options.keep_alive_timeout_s));
  server.set_keep_alive_max_count(static_cast<size_t>(options.keep_alive_max_requests));
  // An answer's header and body are written separately: without this, Nagle's algorithm holds
  // the body back until the client acknowledges the header (up to its delayed-ACK timer).
  server.set_tcp_nodelay(true);
  server.set_error_handler(httplib::Server::HandlerWithResponse(
      [max = options.max_body_bytes, https = https != nullptr](const httplib::Request& req,
                                                               httplib::Response& res) {
        return ErrorBody(max, https, req, res);
      }));
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        // Only allocation can throw on these paths; the server keeps serving.
        Send({.status = 500, .body = oip_rest::ErrorJson("the server ran out of memory")}, res);
      });
  AddRoutes(service, server);
  const int port =
      address->second == 0
          ? server.bind_to_any_port(address->first)
          : (server.bind_to_port(address->first, address->second) ? address->second : -1);
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("http_address: cannot listen on \"",
                                               EchoForMessage(options.address),
                                               "\" (in use, or not a host:port this machine has)"));
  }
  impl->listener = std::thread([&server] { server.listen_after_bind(); });
  // Stop before the listener runs would find nothing to stop and the listener would never end.
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::unique_ptr<HttpServer> http(new HttpServer(std::move(impl)));
  http->port_ = port;
  return http;
}

void HttpServer::Stop() {
  std::call_once(impl_->stop_once, [this] {
    impl_->server->stop();
    if (impl_->listener.joinable()) impl_->listener.join();
  });
}

}  // namespace attnserve::server::http
