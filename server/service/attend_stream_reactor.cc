#include "server/service/attend_stream_reactor.h"

#include <string_view>
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

// An in-band error answer (ErrorStatus) for a message that failed with `status`.
grpc::ByteBuffer ErrorAnswer(std::string_view model, std::string_view request_id,
                             const absl::Status& status, RequestMeter& meter) {
  v1::AttendResponse response;
  FillErrorResponse(model, request_id, status, &response);
  meter.Record(ErrorCodeOf(response));
  grpc::ByteBuffer bytes;
  // Cannot fail: an error answer is a few hundred bytes (ToGrpcStatus bounds the message).
  SerializeWireMessage(response, &bytes).IgnoreError();
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
                  grpc::ByteBuffer answer;
                  const absl::Status answered =
                      result.ok() ? SerializeAttendResponse(work, *result, &answer)
                                  : result.status();
                  if (answered.ok()) {
                    meter.Record(grpc::StatusCode::OK);
                  } else {
                    LogFailure(work.model->name, work.request_id, answered);
                    answer = ErrorAnswer(work.model->name, work.request_id, answered, meter);
                  }
                  Answer(std::move(answer), work.response_bytes());
                },
                &reserved);
  if (scheduled.ok()) {
    Reserve(reserved);  // Until its answer replaces it (which may have happened already).
    return;
  }
  Answer(ErrorAnswer(parsed.ok() ? message.model() : "", parsed.ok() ? message.request_id() : "",
                     scheduled, meter),
         /*reserved_bytes=*/0);
}

}  // namespace attnserve::server
