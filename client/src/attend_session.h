// StreamSession: AttendSession over one AttendStream call (gRPC's callback API).
//
// One write and one read are outstanding at a time; answers are matched to their callbacks by
// request_id. All state is under mu_; gRPC calls and user callbacks run after releasing it.
#ifndef ATTNSERVE_CLIENT_SRC_ATTEND_SESSION_H_
#define ATTNSERVE_CLIENT_SRC_ATTEND_SESSION_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "attnserve/client/client.h"
#include "attnserve/v1/attention.grpc.pb.h"

namespace attnserve::client::internal {

class StreamSession final : public AttendSession,
                            public grpc::ClientBidiReactor<v1::AttendRequest, v1::AttendResponse> {
 public:
  // Starts the call. `stub` must outlive the session.
  StreamSession(v1::AttentionService::Stub* stub, int max_in_flight);
  // Closes the stream if Close was not called, and waits until gRPC is done with it.
  ~StreamSession() override;

  absl::Status Attend(std::string_view model, TensorView input, const AttendOptions& options,
                      Callback done) override;
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
    const v1::AttendRequest* request = nullptr;
  };
  Next NextWriteLocked();
  void Perform(Next next);

  const int max_in_flight_;
  grpc::ClientContext context_;
  v1::AttendResponse response_;  // The read buffer.

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::unique_ptr<v1::AttendRequest>> to_write_;  // Front: being written.
  bool writing_ = false;
  bool closing_ = false;
  bool writes_done_started_ = false;
  bool ended_ = false;  // OnDone has begun: no more requests, writes or answers.
  bool done_ = false;   // OnDone has answered everything: Close may return.
  absl::Status final_status_;
  uint64_t next_id_ = 0;
  struct Pending {
    Callback done;
    std::chrono::steady_clock::time_point start;
    int64_t request_bytes = 0;  // The request's serialized size, for AttendResult.
  };
  std::map<std::string, Pending> pending_;  // By request_id: sent, not yet answered.
};

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_ATTEND_SESSION_H_
