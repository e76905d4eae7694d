// attnserve::client::Client: a connection to one attnserve service (one server, or several behind
// one name with client-side round-robin), and its calls.
//
//   auto client = attnserve::client::Client::Create("dns:///attnserve:50051");
//   absl::StatusOr<AttendResult> result = (*client)->Attend("demo", {data, {16, 512}});
//
// Errors keep the server's gRPC code (absl::StatusCode has the same numbers) and message.
// Retries: calls answered UNAVAILABLE (server draining, or no connection), RESOURCE_EXHAUSTED
// (a model's queue is full; a request too large for any queue is INVALID_ARGUMENT, never
// retried) or CANCELLED by the server (gRPC cancels the calls it has not started when a
// server shuts down; a call this client cancels is never retried) are retried by gRPC's retry
// policy, with exponential backoff and
// ±20 % jitter, up to ClientOptions::max_attempts attempts within the call's deadline (a policy
// sees codes only: a request over the server's --max-message-bytes, which gRPC answers
// RESOURCE_EXHAUSTED, is sent max_attempts times before it fails). Every call
// of the service is idempotent (attention is a pure function of the request), so a retry can
// never do harm; a stream is retried only until its first answer arrives.
//
// Thread-safe: one Client serves any number of threads and calls (they share the connections).
#ifndef ATTNSERVE_CLIENT_CLIENT_H_
#define ATTNSERVE_CLIENT_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/client/decode.h"
#include "attnserve/client/types.h"

namespace attnserve::client {

struct ClientOptions {
  // Deadline of a call whose AttendOptions::deadline is 0, and of the model and health calls.
  std::chrono::milliseconds default_deadline{30'000};
  // Attempts per call, the first included: 1 = never retry. gRPC caps it at 5.
  int max_attempts = 4;
  // Backoff before the n-th retry: min(initial_backoff * backoff_multiplier^(n-1), max_backoff),
  // each randomised by gRPC by ±20 %.
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{2'000};
  double backoff_multiplier = 2.0;
  // Largest request or answer, in bytes (the server's default limit is the same, 64 MiB).
  int64_t max_message_bytes = int64_t{64} << 20;
  // "round_robin" spreads calls over every address the target resolves to (headless Kubernetes
  // services, "ipv4:a:p,b:p"); "pick_first" uses one connection.
  std::string load_balancing_policy = "round_robin";
  // Transport security. All empty: plaintext. tls_ca_path: PEM bundle of the CAs trusted to sign
  // the server's certificate; "system" = the system's trust store. tls_cert_chain_path and
  // tls_private_key_path: this client's certificate, for servers that require mutual TLS (both or
  // neither; they need tls_ca_path). The files are read when the Client is created.
  std::string tls_ca_path = {};
  std::string tls_cert_chain_path = {};
  std::string tls_private_key_path = {};
  // The name the server's certificate must carry, when it is not the target's host (a load
  // balancer's address, an IP literal). "" = the target's host.
  std::string tls_server_name = {};
};

// One AttendStream call: many requests over one stream, answered as they complete (possibly out
// of order). The fastest way to send many small requests.
//
// Thread-safe. Callbacks run on gRPC threads and must not block.
class AttendSession {
 public:
  using Callback = std::function<void(absl::StatusOr<AttendResult>)>;

  virtual ~AttendSession() = default;

  // Sends one request; `done` is called exactly once with its answer or error (a failed message
  // does not end the stream). The result's latency counts from when the session took the request
  // (after any flow-control wait). Requests with no request_id get a unique one. Blocks while
  // max_in_flight requests are unanswered (flow control). FailedPrecondition after Close, or once
  // the stream has failed (then `done` is not called).
  virtual absl::Status Attend(std::string_view model, TensorView input,
                              const AttendOptions& options, Callback done) = 0;
  // Half-closes the stream, waits for every answer and returns the stream's status. Requests
  // still unanswered when the stream fails get its error through their callbacks.
  virtual absl::Status Close() = 0;
};

class Client {
 public:
  using Callback = AttendSession::Callback;

  // `target` is a gRPC target: "host:port", "ipv4:10.0.0.1:50051,10.0.0.2:50051",
  // "dns:///name:port". Does not connect yet (the first call does). InvalidArgument naming the
  // option for bad options.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& target,
                                                        const ClientOptions& options = {});
  virtual ~Client() = default;

  // One attention forward pass of `input` ([T, d_model] or [B, T, d_model]) by `model` ("" =
  // the server's default model). Blocks until the answer.
  virtual absl::StatusOr<AttendResult> Attend(std::string_view model, TensorView input,
                                              const AttendOptions& options = {}) = 0;
  // The same without blocking: `done` runs once, on a gRPC thread, and must not block. A request
  // that cannot be built (InvalidArgument: data and shape disagree) is answered at once, on the
  // calling thread, before AttendAsync returns.
  virtual void AttendAsync(std::string_view model, TensorView input, const AttendOptions& options,
                           Callback done) = 0;
  // The same as a future.
  std::future<absl::StatusOr<AttendResult>> AttendAsync(std::string_view model, TensorView input,
                                                        const AttendOptions& options = {});

  // Opens an AttendStream. `max_in_flight` bounds the unanswered requests (>= 1).
  virtual absl::StatusOr<std::unique_ptr<AttendSession>> OpenSession(int max_in_flight = 256) = 0;

  // Opens a Decode stream (decoding sessions, attnserve/client/decode.h). Does not wait for the
  // server. InvalidArgument naming the option for bad options. The stream has no deadline (its
  // sessions live as long as it does); like every stream it is retried only until its first
  // answer (gRPC then replays the messages sent so far on a new call).
  virtual absl::StatusOr<std::unique_ptr<DecodeStream>> OpenDecodeStream(
      const DecodeStreamOptions& options = {}) = 0;
  // A Decode stream with one session `open` on it (DecodeSession::Open): blocks for the open's
  // answer; its error, or the stream's.
  absl::StatusOr<std::unique_ptr<DecodeSession>> OpenDecodeSession(
      const DecodeOpen& open, const DecodeStreamOptions& options = {});

  virtual absl::StatusOr<std::vector<ModelInfo>> ListModels() = 0;
  // "" = the default model. NotFound (listing the serving models) for an unknown name.
  virtual absl::StatusOr<ModelInfo> GetModel(std::string_view name) = 0;
  // grpc.health.v1: OK when `service` ("" = the whole server; or a model's name) is SERVING,
  // Unavailable when NOT_SERVING or unreachable, NotFound for a name the server does not know.
  virtual absl::Status Health(std::string_view service = "") = 0;
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_CLIENT_H_
