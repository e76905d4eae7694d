// Decoding sessions over attnserve.v1's Decode stream: the server keeps each session's K/V in its
// KV cache, so a client generating token by token sends only each new row, and the server batches
// the one-row steps of every session (of every client) into one forward pass per iteration.
//
//   auto stream = client->OpenDecodeStream();                 // one gRPC bidi stream
//   DecodeMessage first;                                       // open two sessions and prefill
//   first.opens = {{.session = "a", .model = "demo"}, {.session = "b", .model = "demo"}};
//   first.steps = {{.session = "a", .rows = {prompt_a, {128, 512}}},
//                  {.session = "b", .rows = {prompt_b, {40, 512}}}};
//   absl::StatusOr<DecodeAnswer> answer = (*stream)->Send(first);
//   DecodeMessage step;                                        // then one message per step
//   step.steps = {{.session = "a", .rows = {row_a, {1, 512}}},
//                 {.session = "b", .rows = {row_b, {1, 512}}}};
//   answer = (*stream)->Send(step);            // answer->steps[i]: StatusOr<Tensor> [1, 512]
//
// Sessions belong to the stream that opened them: Close (or destroying the stream), a cancelled
// call or a lost connection closes every session the stream still holds and frees its cache on
// the server. A session with no step for the server's idle timeout is closed by the server.
//
// Errors: a message that could not be sent or answered (bad tensor, stream ended) fails as a
// whole (the StatusOr of the answer); otherwise every item has its own status (an unknown session,
// a wrong width, a non-finite value, a full KV budget fail that item only, with the server's gRPC
// code and message), and the other items and sessions go on.
#ifndef ATTNSERVE_CLIENT_DECODE_H_
#define ATTNSERVE_CLIENT_DECODE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/client/types.h"

namespace attnserve::client {

// Options of one Decode stream (fixed for its life).
struct DecodeStreamOptions {
  // Messages sent and not yet answered; a send blocks while this many are (>= 1). The server
  // reads at most 64 messages ahead of its answers.
  int max_in_flight = 64;
  // Rows and memory as raw little-endian bytes (fast) instead of repeated floats; the answers
  // likewise. 16-bit wire types need raw (as AttendOptions).
  bool raw = true;
  WireDtype wire_dtype = WireDtype::kFloat32;         // Rows and memory sent.
  WireDtype answer_wire_dtype = WireDtype::kFloat32;  // Outputs received (widened to float32).
};

// Opens a session on the model's current version; the session computes with that version for its
// whole life, even after the server reloads the model.
struct DecodeOpen {
  // The caller's name for the session, unique among this stream's open sessions (a closed
  // session's name may be reused); non-empty.
  std::string session = {};
  std::string model = {};        // "" = the server's default model.
  int64_t expected_version = 0;  // 0 = any; else FailedPrecondition unless it is served.
  // Cross-attention: the encoder memory [S, d_model], sent once and kept in the server's cache;
  // steps then attend over it (no mask). Absent: causal self-attention over the session's rows.
  std::optional<TensorView> memory = {};
};

// Rows for one open session: a prefill of many rows, or a one-row step.
struct DecodeStep {
  std::string session = {};
  TensorView rows = {};  // [rows, d_model], rows >= 1, finite.
};

// One message of the stream: opens, then steps (a step may name a session opened by the same
// message), then closes (taking effect once the same message's steps are answered).
struct DecodeMessage {
  std::vector<DecodeOpen> opens = {};
  std::vector<DecodeStep> steps = {};
  std::vector<std::string> closes = {};  // Sessions to close.
};

struct DecodeOpened {
  std::string session = {};
  std::string model = {};  // The model that serves the session.
  int64_t model_version = 0;
};

// The answer to one DecodeMessage: one result per item, in the message's order.
struct DecodeAnswer {
  std::vector<absl::StatusOr<DecodeOpened>> opens = {};
  std::vector<absl::StatusOr<Tensor>> steps = {};  // Each [rows, d_model].
  std::vector<absl::Status> closes = {};
  std::chrono::microseconds latency{0};  // Client side: send (after flow control) to answer.
  // Serialized protobuf sizes of the message and its answer, bytes.
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
};

// One Decode call (a gRPC bidi stream) carrying any number of sessions.
//
// Thread-safe: any thread may send; answers may complete in any order. Callbacks run on gRPC
// threads and must not block (in particular, must not call the blocking Send).
class DecodeStream {
 public:
  using Callback = std::function<void(absl::StatusOr<DecodeAnswer>)>;

  // Closes the stream if Close was not called, waiting for the unanswered messages.
  virtual ~DecodeStream() = default;

  // Sends `message` without waiting for its answer; `done` is called exactly once with the
  // answer, or with the error of the whole message (the stream's error when it ended first).
  // Tensors are copied before it returns. Blocks while max_in_flight messages are unanswered.
  // Fails without calling `done`: InvalidArgument (a tensor's data and shape disagree, a
  // 16-bit wire type without raw), FailedPrecondition after Close or once the stream has ended.
  virtual absl::Status SendAsync(const DecodeMessage& message, Callback done) = 0;
  // The same as a future (its value holds the send's error when SendAsync failed).
  std::future<absl::StatusOr<DecodeAnswer>> SendAsync(const DecodeMessage& message);
  // Sends and blocks until the answer: the answer, or the send's or the message's error.
  absl::StatusOr<DecodeAnswer> Send(const DecodeMessage& message);

  // One-item conveniences over Send, each blocking for its answer: the item's own result, or
  // the message's error. The server's item errors (the same in DecodeAnswer):
  // Open: InvalidArgument (empty or duplicate session name, bad memory), NotFound (unknown model),
  // FailedPrecondition (expected_version not served), ResourceExhausted (too many sessions, or
  // the memory does not fit the KV cache budget).
  absl::StatusOr<DecodeOpened> Open(const DecodeOpen& open);
  // `rows` [rows, d_model] for an open session; their outputs [rows, d_model]. InvalidArgument
  // (unknown session, wrong width, a non-finite value), ResourceExhausted (the KV cache budget is
  // full; the session is unchanged), Cancelled / Unavailable (the session was closed or the
  // server drains before the step ran).
  absl::StatusOr<Tensor> Step(const std::string& session, TensorView rows);
  // Closes one session (after this stream's earlier steps for it) and frees its cache.
  // InvalidArgument for a session that is not open on this stream.
  absl::Status CloseSession(const std::string& session);

  // Half-closes the stream, waits for every answer and returns the stream's status (OK when the
  // server ended it normally). The server then closes every session still open on it.
  // Idempotent.
  virtual absl::Status Close() = 0;
};

// One decoding session on a stream of its own: the simple way when a caller decodes one
// sequence (a caller decoding many sequences should put them on one DecodeStream and send one
// message per step).
//
// Thread-safe as DecodeStream. Destroying it closes the session (see Close).
class DecodeSession {
 public:
  using Callback = std::function<void(absl::StatusOr<Tensor>)>;

  // Opens `open` on `stream` (blocking for the server's answer) and owns the stream from then
  // on. The open's error (NotFound for an unknown model, FailedPrecondition for a version
  // mismatch, ...) or the stream's when it fails.
  static absl::StatusOr<std::unique_ptr<DecodeSession>> Open(std::unique_ptr<DecodeStream> stream,
                                                             const DecodeOpen& open);
  ~DecodeSession();

  const DecodeOpened& opened() const { return opened_; }

  // Appends `rows` ([rows, d_model]: a prompt or one row) and blocks for their outputs. Errors
  // as DecodeStream::Step; FailedPrecondition after Close.
  absl::StatusOr<Tensor> Step(TensorView rows);
  // The same without blocking: `done` runs once on a gRPC thread (must not block). Blocks only
  // for flow control. Errors as DecodeStream::SendAsync.
  absl::Status StepAsync(TensorView rows, Callback done);
  std::future<absl::StatusOr<Tensor>> StepAsync(TensorView rows);
  // Closes the session and its stream, after its unanswered steps; the stream's status.
  absl::Status Close();

 private:
  DecodeSession(std::unique_ptr<DecodeStream> stream, DecodeOpened opened)
      : stream_(std::move(stream)), opened_(std::move(opened)) {}

  std::unique_ptr<DecodeStream> stream_;
  DecodeOpened opened_;
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_DECODE_H_
