// GrpcDecodeStream: DecodeStream over one attnserve.v1 Decode call (gRPC's callback API).
//
// One write and one read are outstanding at a time; answers are matched to their callbacks by
// request_id. All state is under mu_; gRPC calls and user callbacks run after releasing it.
// The same protocol as StreamSession (attend_session.h), with Decode's messages.
#ifndef ATTNSERVE_CLIENT_SRC_DECODE_STREAM_H_
#define ATTNSERVE_CLIENT_SRC_DECODE_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "attnserve/client/decode.h"
#include "attnserve/v1/attention.grpc.pb.h"

namespace attnserve::client::internal {

class GrpcDecodeStream final
    : public DecodeStream,
      public grpc::ClientBidiReactor<v1::DecodeRequest, v1::DecodeResponse> {
 public:
  // Starts the call. `stub` must outlive the stream; options.max_in_flight >= 1.
  GrpcDecodeStream(v1::AttentionService::Stub* stub, const DecodeStreamOptions& options);
  // Closes the stream if Close was not called, and waits until gRPC is done with it.
  ~GrpcDecodeStream() override;

  using DecodeStream::SendAsync;
  absl::Status SendAsync(const DecodeMessage& message, Callback done) override;
  absl::Status Close() override;

  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // What to start after releasing mu_: the next write, or WritesDone once closing and everything
  // is written.
  struct Next {
    enum Kind { kNothing, kWrite, kWritesDone };
    Kind kind = kNothing;
    const v1::DecodeRequest* request = nullptr;
  };
  Next NextWriteLocked();
  void Perform(Next next);

  const DecodeStreamOptions options_;
  grpc::ClientContext context_;
  v1::DecodeResponse response_;  // The read buffer.

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<const v1::DecodeRequest>> to_write_;  // Front: being written.
  bool writing_ = false;
  bool closing_ = false;
  bool writes_done_started_ = false;
  bool ended_ = false;  // OnDone has begun: no more messages, writes or answers.
  bool done_ = false;   // OnDone has answered everything: Close may return.
  absl::Status final_status_;
  uint64_t next_id_ = 0;
  struct Pending {
    Callback done;
    std::chrono::steady_clock::time_point start;
    // The message as sent (shared with to_write_ until written): its item counts check the answer.
    std::shared_ptr<const v1::DecodeRequest> request;
    int64_t request_bytes = 0;
  };
  std::map<std::string, Pending> pending_;  // By request_id: sent, not yet answered.
};

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_DECODE_STREAM_H_
