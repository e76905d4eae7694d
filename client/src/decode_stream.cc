#include "client/src/decode_stream.h"

#include <utility>

#include "client/src/conversion.h"

namespace attnserve::client::internal {

GrpcDecodeStream::GrpcDecodeStream(v1::AttentionService::Stub* stub,
                                   const DecodeStreamOptions& options)
    : BidiStreamClient(
          {.max_in_flight = options.max_in_flight,
           // ReadDecodeResponse checks the answer against the message.
           .keep_requests = true,
           .id_prefix = "d",
           .closed_error = "the Decode stream is closed",
           .ended_error = "the Decode stream has ended",
           .unanswered_error = "the Decode stream ended without answering this message"}),
      options_(options) {
  stub->async()->Decode(context(), this);
  Begin();
}

GrpcDecodeStream::~GrpcDecodeStream() { (void)CloseAndWait(); }

absl::Status GrpcDecodeStream::SendAsync(const DecodeMessage& message, Callback done) {
  // Built before SendRequest takes its lock (copying the tensors); SendRequest gives it its id.
  absl::StatusOr<v1::DecodeRequest> request = MakeDecodeRequest(message, options_, "");
  if (!request.ok()) return request.status();
  return SendRequest(*std::move(request), std::move(done));
}

absl::Status GrpcDecodeStream::Close() { return CloseAndWait(); }

absl::StatusOr<DecodeAnswer> GrpcDecodeStream::ReadAnswer(const v1::DecodeRequest* request,
                                                          const v1::DecodeResponse& response) {
  return ReadDecodeResponse(*request, response);
}

}  // namespace attnserve::client::internal
