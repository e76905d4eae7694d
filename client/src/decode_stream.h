// GrpcDecodeStream: DecodeStream over one attnserve.v1 Decode call (gRPC's callback API).
//
// The stream itself (one write and one read outstanding, answers matched to their callbacks by
// request_id, flow control, every message completed exactly once) is BidiStreamClient's
// (bidi_stream_client.h), shared with StreamSession; this adds Decode's messages.
#ifndef ATTNSERVE_CLIENT_SRC_DECODE_STREAM_H_
#define ATTNSERVE_CLIENT_SRC_DECODE_STREAM_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/client/decode.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "client/src/bidi_stream_client.h"

namespace attnserve::client::internal {

class GrpcDecodeStream final
    : public DecodeStream,
      public BidiStreamClient<v1::DecodeRequest, v1::DecodeResponse, DecodeAnswer> {
 public:
  // Starts the call. `stub` must outlive the stream; options.max_in_flight >= 1.
  GrpcDecodeStream(v1::AttentionService::Stub* stub, const DecodeStreamOptions& options);
  // Closes the stream if Close was not called, and waits until gRPC is done with it.
  ~GrpcDecodeStream() override;

  using DecodeStream::SendAsync;
  absl::Status SendAsync(const DecodeMessage& message, Callback done) override;
  absl::Status Close() override;

 private:
  // Checks the answer's item counts against the message's.
  absl::StatusOr<DecodeAnswer> ReadAnswer(const v1::DecodeRequest* request,
                                          const v1::DecodeResponse& response) override;

  const DecodeStreamOptions options_;
};

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_DECODE_STREAM_H_
