// DecodeStreamReactor: one Decode call (attnserve.v1 decoding sessions). The stream owns the
// sessions it opens: each message's opens, steps and closes go to the DecodeRuntime, and the
// message is answered with one DecodeResponse once all its items are done (an item that fails is
// answered with its error; the others go on). Messages travel as raw bytes, parsed here; an
// unparseable one is answered with DecodeResponse.error and the stream goes on.
//
// Within a message: opens first (a tag is usable at once: steps may follow in the same message),
// then steps (appended in order, so a session's steps run in message order), then closes, which
// take effect once the message's own steps are answered (a last step and its close may travel
// together). A close cancels that session's steps of later messages still queued.
//
// Life: when the call ends — the client half-closed and every message is answered, the client
// cancelled, or its connection dropped — every session the stream opened is closed
// (DecodeRuntime::CloseOwner, reason owner_gone), so a vanished client never holds KV cache. On
// cancel the sessions are closed at once, so queued steps are answered CANCELLED and the call ends
// without waiting for compute it no longer needs.
//
// Flow control is FlowControlledStream's (flow_controlled_stream.h), as AttendStream's: a message
// still computing holds its own size of the unsent-byte budget, an answer its serialised size; so
// a client that does not read its answers is slowed, not buffered.
//
// Metrics: each message counts as one request, method="Decode", from its read to its answer
// (MeterModel says under which model; the code is its first failed item's, OK when none failed).
//
// Drain (DrainableStream): the stream stops reading, answers the messages it accepted, then
// finishes UNAVAILABLE ("server is shutting down"), so a client knows to reconnect elsewhere.
//
// Thread-safety: reactions run on gRPC threads and the runtime's callbacks on its loop thread;
// the flow state is FlowControlledStream's, the session tags are under tags_->mu, and neither lock
// is held while calling gRPC or the runtime. The stream finishes only once every message is
// answered, and nothing touches the reactor after Finish (OnDone deletes it).
#ifndef ATTNSERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_
#define ATTNSERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "attnserve/v1/attention.pb.h"
#include "server/conversion/attnserve_v1/decode_conversion.h"
#include "server/conversion/attnserve_v1/decode_response_encoder.h"
#include "server/decoding/decode_runtime.h"
#include "server/service/attend_submitter.h"
#include "server/service/flow_controlled_stream.h"
#include "server/service/request_meter.h"
#include "server/service/stream_registry.h"

namespace attnserve::server {

class DecodeStreamReactor final : public FlowControlledStream {
 public:
  static constexpr int kMaxInFlightPerStream = 64;

  // Registers with `streams` and starts reading (or, when `submitter` drains, finishes
  // UNAVAILABLE at once). The submitter gives the routes, the drain switch and the request meters
  // (attnserve_requests_total{method="Decode"}). `runtime`, `submitter` and `streams` must
  // outlive the reactor (the gRPC server is shut down before them). `owner` must be unique among
  // the runtime's owners. max_unsent_bytes >= 1.
  DecodeStreamReactor(decoding::DecodeRuntime* runtime, const AttendSubmitter* submitter,
                      StreamRegistry* streams, decoding::OwnerKey owner, int64_t max_unsent_bytes);

  void OnCancel() override;

 private:
  struct Pending;  // One message whose answer is being assembled.

  // FlowControlledStream: starts one message; closes the stream's sessions once the client is
  // gone (its queued steps are answered CANCELLED at once instead of computed for nobody), and
  // when the call is over.
  void OnMessage(grpc::ByteBuffer* bytes) override;
  void OnClientGone() override;
  void OnStreamDone() override;

  // The model label `message` counts under in the request metrics: its first item's model (the
  // model an open names, the session's model for a step or close); kUnknownModel for a tag not
  // open on this stream or a message without items.
  std::string MeterModel(const v1::DecodeRequest& message);
  // Starts every item of `message`; its answer is queued (and `meter` recorded) when the last
  // item is done.
  void Start(const v1::DecodeRequest& message, int64_t reserved_bytes, const RequestMeter& meter);
  void StartOpen(const v1::DecodeRequest& message, int index,
                 const std::shared_ptr<Pending>& pending);
  // Queues all of the message's steps with one DecodeRuntime::AppendAll, so they share an
  // iteration; a step that cannot be queued is answered with its error.
  void StartSteps(const v1::DecodeRequest& message, const std::shared_ptr<Pending>& pending);
  // Step `index` of `message` as a runtime request whose `done` fills its answer, or its error.
  absl::StatusOr<decoding::StepRequest> PrepareStep(const v1::DecodeRequest& message, int index,
                                                    const std::shared_ptr<Pending>& pending);
  // Answers step `index` with `status`.
  void FailStep(int index, const absl::Status& status, const std::shared_ptr<Pending>& pending);
  void StartClose(const v1::DecodeRequest& message, int index,
                  const std::shared_ptr<Pending>& pending);
  // One item of `pending` is done; the last one closes the message's sessions and answers it.
  void ItemDone(const std::shared_ptr<Pending>& pending);
  // Queues an answer for writing (or drops it when the client is gone): `response` with each
  // step's output from `outputs` (none for a message without steps).
  void QueueAnswer(const v1::DecodeResponse& response,
                   std::span<const std::optional<DecodeStepOutput>> outputs,
                   int64_t reserved_bytes);

  decoding::DecodeRuntime* const runtime_;
  const AttendSubmitter* const submitter_;
  const decoding::OwnerKey owner_;

  // The stream's sessions by tag, shared with the runtime's close callbacks (which may come after
  // the stream is gone).
  struct Tags {
    // The most tags of sessions the server closed kept to answer a late step with the reason,
    // and their most bytes.
    static constexpr size_t kMaxClosedTags = 256;
    static constexpr int64_t kMaxClosedTagBytes = 64 << 10;

    // The server closed the session opened as `serial` under `tag` (idle, drained): the tag is
    // kept, holding no model version, until reopened, closed by the client or evicted (oldest
    // first past the bounds above).
    void MarkClosed(const std::string& tag, uint64_t serial, decoding::CloseReason reason);

    std::mutex mu;
    DecodeSessionTags map ABSL_GUARDED_BY(mu);
    uint64_t last_serial ABSL_GUARDED_BY(mu) = 0;  // Of the last open.
    std::deque<std::pair<std::string, uint64_t>> closed_order ABSL_GUARDED_BY(mu);
    int64_t closed_bytes ABSL_GUARDED_BY(mu) = 0;
  };
  const std::shared_ptr<Tags> tags_ = std::make_shared<Tags>();
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_
