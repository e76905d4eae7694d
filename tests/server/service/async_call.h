// AsyncCall: one unary Attend in flight through the callback client API, for tests that need
// several requests queued at once.
#ifndef ATTNSERVE_TESTS_SERVER_SERVICE_ASYNC_CALL_H_
#define ATTNSERVE_TESTS_SERVER_SERVICE_ASYNC_CALL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "core/util/happens_before.h"
#include "core/util/notification.h"

namespace attnserve::testing {

class AsyncCall {
 public:
  // Starts the call with a deadline `deadline` from now.
  AsyncCall(v1::AttentionService::Stub& stub, v1::AttendRequest request,
            std::chrono::milliseconds deadline = std::chrono::seconds(30))
      : request_(std::move(request)) {
    context_.set_deadline(std::chrono::system_clock::now() + deadline);
    HandOff(this);  // To the callback, on a gRPC thread (core/util/happens_before.h).
    stub.async()->Attend(&context_, &request_, &response_, [this](grpc::Status status) {
      TakeOver(this);
      status_ = std::move(status);
      done_.Notify();
    });
  }
  // Waits for the answer (at most 60 s, so a hang fails the test instead of blocking it).
  bool Wait() { return done_.WaitForNotificationWithTimeout(absl::Seconds(60)); }
  // Whether the answer came within `timeout`.
  bool WaitFor(absl::Duration timeout) { return done_.WaitForNotificationWithTimeout(timeout); }
  void Cancel() { context_.TryCancel(); }

  const grpc::Status& status() const { return status_; }
  const v1::AttendResponse& response() const { return response_; }
  const v1::AttendRequest& request() const { return request_; }

 private:
  grpc::ClientContext context_;
  v1::AttendRequest request_;
  v1::AttendResponse response_;
  grpc::Status status_;
  Notification done_;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SERVER_SERVICE_ASYNC_CALL_H_
