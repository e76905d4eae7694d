// AttendStreamReactor: one AttendStream call. Each message read is scheduled like a unary Attend;
// answers are written as they come back, so they may be out of order (request_id tells them
// apart). A message that fails validation or scheduling, or that protobuf cannot parse (messages
// travel as raw bytes, parsed here), is answered with AttendResponse.error and the stream goes on.
//
// Flow control and life are FlowControlledStream's (flow_controlled_stream.h): an answer still
// computing holds its payload size of the unsent-byte budget (known from the request), a computed
// one its serialised size. The stream finishes OK once the client has half-closed (or the server
// drains) and every accepted message has been answered and written.
//
// Thread-safety: reactions run on gRPC threads, answers arrive on batcher threads; the flow state
// is FlowControlledStream's, and the reactor keeps none of its own.
#ifndef ATTNSERVE_SERVER_SERVICE_ATTEND_STREAM_REACTOR_H_
#define ATTNSERVE_SERVER_SERVICE_ATTEND_STREAM_REACTOR_H_

#include <cstdint>

#include "attnserve/v1/attention.grpc.pb.h"
#include "server/service/attend_submitter.h"
#include "server/service/flow_controlled_stream.h"
#include "server/service/stream_registry.h"

namespace attnserve::server {

class AttendStreamReactor final : public FlowControlledStream {
 public:
  static constexpr int kMaxInFlightPerStream = 256;

  // Registers with `streams` and starts reading. `submitter` and `streams` must outlive the
  // reactor (the gRPC server is shut down first). max_unsent_bytes >= 1.
  AttendStreamReactor(AttendSubmitter* submitter, StreamRegistry* streams,
                      grpc::CallbackServerContext* context, int64_t max_unsent_bytes);

 private:
  // FlowControlledStream: parses and schedules one message like a unary Attend.
  void OnMessage(grpc::ByteBuffer* bytes) override;

  AttendSubmitter* const submitter_;
  grpc::CallbackServerContext* const context_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_ATTEND_STREAM_REACTOR_H_
