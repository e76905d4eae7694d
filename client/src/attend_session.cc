#include "client/src/attend_session.h"

#include <utility>

#include "client/src/conversion.h"

namespace attnserve::client::internal {

StreamSession::StreamSession(v1::AttentionService::Stub* stub, int max_in_flight)
    : BidiStreamClient({.max_in_flight = max_in_flight,
                        .keep_requests = false,
                        .id_prefix = "s",
                        .closed_error = "the session is closed",
                        .ended_error = "the stream has ended",
                        .unanswered_error = "the stream ended without answering this request"}) {
  stub->async()->AttendStream(context(), this);
  Begin();
}

StreamSession::~StreamSession() { (void)CloseAndWait(); }

absl::Status StreamSession::Attend(std::string_view model, TensorView input,
                                   const AttendOptions& options, Callback done) {
  absl::StatusOr<v1::AttendRequest> request = MakeAttendRequest(model, input, options);
  if (!request.ok()) return request.status();
  return SendRequest(*std::move(request), std::move(done));
}

absl::Status StreamSession::Close() { return CloseAndWait(); }

absl::StatusOr<AttendResult> StreamSession::ReadAnswer(const v1::AttendRequest* /*request*/,
                                                       const v1::AttendResponse& response) {
  if (response.has_error()) {
    return absl::Status(static_cast<absl::StatusCode>(response.error().code()),
                        response.error().message());
  }
  return ReadAttendResponse(response);
}

}  // namespace attnserve::client::internal
