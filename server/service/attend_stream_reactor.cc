#include "server/service/attend_stream_reactor.h"

#include <utility>

#include "server/conversion/attnserve_v1/conversion.h"
#include "server/service/wire_messages.h"

namespace attnserve::server {
namespace {

// The in-band status of one stream answer, as metrics count it.
grpc::StatusCode ErrorCodeOf(const v1::AttendResponse& response) {
  return response.has_error() ? static_cast<grpc::StatusCode>(response.error().code())
                              : grpc::StatusCode::OK;
}

// `response` as bytes to write; an in-band Internal error in its place if it cannot be
// serialised (over protobuf's 2 GiB), so the message still gets an answer.
grpc::ByteBuffer Serialized(const v1::AttendResponse& response) {
  grpc::ByteBuffer bytes;
  absl::Status status = SerializeWireMessage(response, &bytes);
  if (!status.ok()) {
    v1::AttendResponse error;
    FillErrorResponse(response.model(), response.request_id(), status, &error);
    status = SerializeWireMessage(error, &bytes);
  }
  return bytes;
}

}  // namespace

AttendStreamReactor::AttendStreamReactor(AttendSubmitter* submitter, StreamRegistry* streams,
                                         grpc::CallbackServerContext* context,
                                         int64_t max_unsent_bytes)
    : FlowControlledStream(streams, {.max_in_flight_messages = kMaxInFlightPerStream,
                                     .max_unsent_bytes = max_unsent_bytes,
                                     .drained_status = grpc::Status::OK}),
      submitter_(submitter),
      context_(context) {
  Begin([submitter] { return submitter->draining(); });
}

void AttendStreamReactor::OnMessage(grpc::ByteBuffer* bytes) {
  // A local, freed when this reaction ends: the task holds its own copy of the inputs.
  v1::AttendRequest message;
  const absl::Status parsed = ParseWireMessage(*bytes, "message", &message);
  bytes->Clear();  // Parsed: the bytes need not wait for the next read to be freed.
  // An unparseable message names no model: it counts under the unknown model's series.
  RequestMeter meter = submitter_->StartMeter(
      metrics::Method::kAttendStream, parsed.ok() ? message.model() : metrics::kUnknownModel);
  int64_t reserved = 0;
  absl::Status scheduled =
      !parsed.ok()
          ? parsed
          : submitter_->Submit(
                message, context_,
                [this, meter](const AttendWork& work, absl::StatusOr<AttendResult> result) mutable {
                  v1::AttendResponse response;
                  absl::Status filled =
                      result.ok() ? FillAttendResponse(work, *result, &response) : result.status();
                  if (!filled.ok()) {
                    LogFailure(work.model->name, work.request_id, filled);
                    FillErrorResponse(work.model->name, work.request_id, filled, &response);
                  }
                  meter.Record(ErrorCodeOf(response));
                  Answer(Serialized(response), work.response_bytes());
                },
                &reserved);
  if (scheduled.ok()) {
    Reserve(reserved);  // Until its answer replaces it (which may have happened already).
    return;
  }
  v1::AttendResponse response;
  FillErrorResponse(parsed.ok() ? message.model() : "", parsed.ok() ? message.request_id() : "",
                    scheduled, &response);
  meter.Record(ErrorCodeOf(response));
  Answer(Serialized(response), /*reserved_bytes=*/0);
}

}  // namespace attnserve::server
