// StreamSession: AttendSession over one AttendStream call (gRPC's callback API).
//
// The stream itself (one write and one read outstanding, answers matched to their callbacks by
// request_id, flow control, every request completed exactly once) is BidiStreamClient's
// (bidi_stream_client.h), shared with GrpcDecodeStream; this adds AttendStream's messages.
#ifndef ATTNSERVE_CLIENT_SRC_ATTEND_SESSION_H_
#define ATTNSERVE_CLIENT_SRC_ATTEND_SESSION_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/client/client.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "client/src/bidi_stream_client.h"

namespace attnserve::client::internal {

class StreamSession final
    : public AttendSession,
      public BidiStreamClient<v1::AttendRequest, v1::AttendResponse, AttendResult> {
 public:
  // Starts the call. `stub` must outlive the session; max_in_flight >= 1.
  StreamSession(v1::AttentionService::Stub* stub, int max_in_flight);
  // Closes the stream if Close was not called, and waits until gRPC is done with it.
  ~StreamSession() override;

  absl::Status Attend(std::string_view model, TensorView input, const AttendOptions& options,
                      Callback done) override;
  absl::Status Close() override;

 private:
  absl::StatusOr<AttendResult> ReadAnswer(const v1::AttendRequest* request,
                                          const v1::AttendResponse& response) override;
};

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_ATTEND_SESSION_H_
