// HttpServer: RestService's endpoints on an HTTP/1.1 port (cpp-httplib), plaintext or HTTPS.
//
//   GET  /v2                                     server metadata
//   GET  /v2/health/live, /v2/health/ready       liveness, readiness
//   GET  /v2/models/{name}[/versions/{v}]        model metadata
//   GET  /v2/models/{name}[/versions/{v}]/ready  model readiness
//   POST /v2/models/{name}[/versions/{v}]/infer  inference (JSON, or the binary data extension)
//
// Each connection is served by one worker thread for as long as it is kept alive; `threads`
// bounds the connections served at once and `max_queued_connections` those accepted and waiting
// for a worker (past it the server stops accepting and the kernel's backlog holds the rest).
// Bodies past max_body_bytes are refused 413 unread and the connection closed (on plaintext;
// over HTTPS it stays until the keep-alive timeout); header lines past 8 KiB 400, paths past
// 8 KiB 414, unknown paths 404 and wrong methods 405, each with {"error": "..."}. cpp-httplib
// 0.11's limits: pipelined requests are not supported (only the first is answered), and after a
// malformed or timed-out request line or header the connection stays until the keep-alive
// timeout.
//
// Thread-safe: Stop from any thread; idempotent. The service (and the HTTPS files' owner) must
// outlive the server.
#ifndef ATTNSERVE_SERVER_HTTP_HTTP_SERVER_H_
#define ATTNSERVE_SERVER_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/http/rest_service.h"

namespace attnserve::server::http {

struct HttpServerOptions {
  // host:port; port 0 picks a free port (HttpServer::port() tells which).
  std::string address = "0.0.0.0:8000";
  // Worker threads: the connections served at once. >= 1.
  int threads = 32;
  // Accepted connections waiting for a worker; past it the server stops accepting until one is
  // free. >= 1.
  int max_queued_connections = 64;
  // The largest request body, in bytes; a larger one is refused 413 before it is read. >= 1.
  int64_t max_body_bytes = int64_t{64} << 20;
  // A client silent this long in the middle of a request (headers or body) is disconnected, and
  // one that does not take the answer this long too. >= 1.
  int64_t read_timeout_ms = 10000;
  int64_t write_timeout_ms = 10000;
  // An idle kept-alive connection is closed after this long; >= 1 s.
  int64_t keep_alive_timeout_s = 5;
  // Requests one connection may carry before the server closes it. >= 1.
  int keep_alive_max_requests = 10000;
};

// InvalidArgument naming the option when one is out of its range.
absl::Status ValidateHttpServerOptions(const HttpServerOptions& options);

// HTTPS: the certificate chain and key (PEM) to serve, and the client CAs (mutual TLS when not
// empty). `generation` changes whenever the files were replaced by a new checked set; each
// handshake then serves the new certificate.
struct HttpsFiles {
  std::string cert_chain_path;
  std::string private_key_path;
  std::string client_ca_path;
  std::function<int64_t()> generation;
};

class HttpServer {
 public:
  // Binds options.address and starts serving `service` on it; HTTPS when `https` is not null.
  // InvalidArgument for bad options (naming the option); Unavailable when the address cannot be
  // bound; InvalidArgument naming the file when the HTTPS files cannot be served.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           RestService* service,
                                                           const HttpsFiles* https);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // Stops accepting, lets every request being served finish and be answered (a kept-alive
  // connection is closed after its current request), and joins the workers.
  void Stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace attnserve::server::http

#endif  // ATTNSERVE_SERVER_HTTP_HTTP_SERVER_H_
