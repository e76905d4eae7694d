// RestService: the Open Inference Protocol's HTTP/REST endpoints (KServe v2 REST), as plain
// functions from a request's parts to a reply, so that they can be tested without sockets;
// http_server.h puts them on a port.
//
// An infer takes the ModelInfer path of the gRPC service: the same AttendSubmitter (route,
// validation, the model's batch queue and limits, drain), the protocol's conversion
// (server/conversion/oip/) behind the REST one (server/conversion/oip_rest/), and metrics under
// method="RestInfer". Errors are the protocol's: an HTTP status (rest_conversion.h's
// HttpStatusOf) and {"error": "..."} naming the field.
//
// Thread-safe. Infer blocks its calling thread (an HTTP worker) until the answer is computed;
// the submitter and open_calls must outlive the service. Every infer counts in open_calls while
// it runs, so the drain waits for it.
#ifndef ATTNSERVE_SERVER_HTTP_REST_SERVICE_H_
#define ATTNSERVE_SERVER_HTTP_REST_SERVICE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "server/service/attend_submitter.h"
#include "server/service/inference_service.h"
#include "server/service/open_calls.h"

namespace attnserve::server::http {

// What an endpoint answers.
struct HttpReply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  // Set for answers with binary outputs: the length of the JSON before them.
  std::optional<size_t> json_length = {};
};

class RestService {
 public:
  RestService(AttendSubmitter* submitter, OpenCalls* open_calls, InferenceServerIdentity identity);
  RestService(const RestService&) = delete;
  RestService& operator=(const RestService&) = delete;

  // GET /v2/health/live: 200 while the process serves.
  HttpReply Live() const;
  // GET /v2/health/ready: 200 while not draining and some model serves, else 503.
  HttpReply Ready() const;
  // GET /v2: the server's name, version and extensions.
  HttpReply ServerMetadata() const;
  // GET /v2/models/{name}[/versions/{version}]: 404 naming the serving models for an unknown
  // name, 404 for a version other than the serving one.
  HttpReply ModelMetadata(std::string_view name, std::string_view version) const;
  // GET /v2/models/{name}[/versions/{version}]/ready: 200 when it serves, else 404 (unknown) or
  // 503 (draining).
  HttpReply ModelReady(std::string_view name, std::string_view version) const;
  // POST /v2/models/{name}[/versions/{version}]/infer with `body`; `header_length` is the
  // Inference-Header-Content-Length header (null when absent). Blocks until answered.
  HttpReply Infer(std::string_view name, std::string_view version, std::string_view body,
                  const std::string* header_length);

 private:
  AttendSubmitter* const submitter_;
  OpenCalls* const open_calls_;
  const InferenceServerIdentity identity_;
};

// An error reply: HttpStatusOf(status.code()) and {"error": message}.
HttpReply ErrorReply(const absl::Status& status);

}  // namespace attnserve::server::http

#endif  // ATTNSERVE_SERVER_HTTP_REST_SERVICE_H_
