// UnaryReactor: the self-deleting unary reactor both gRPC services' handlers return.
#ifndef ATTNSERVE_SERVER_SERVICE_UNARY_REACTOR_H_
#define ATTNSERVE_SERVER_SERVICE_UNARY_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include "core/util/happens_before.h"
#include "server/conversion/grpc_status.h"
#include "server/service/drain_gate.h"
#include "server/service/open_calls.h"
#include "server/service/request_meter.h"
#include "server/service/wire_messages.h"

namespace attnserve::server {

// A unary reactor that deletes itself when the call is done, counted in `open_calls` (which must
// outlive it) from construction to OnDone. gRPC's DefaultReactor would serve, but its OnDone is
// gRPC's own, and ThreadSanitizer needs one of ours to see that Finish (often on a batch thread)
// happens before gRPC destroys the call's messages (core/util/happens_before.h). The cost is one
// small allocation per call.
//
// `Response` is the message a call answering in bytes (Attend, ModelInfer) fills: FinishCall
// serialises it into the wire response given with set_wire_response when the call is OK.
// Thread-safety: setters before FinishCall, from the handler's thread; FinishCall from any thread.
template <typename Response>
class UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(OpenCalls* open_calls, RequestMeter meter) : open_calls_(open_calls), meter_(meter) {
    open_calls_->Add();
  }
  // Before FinishCall: the meter, when it can only start once the request is parsed.
  void set_meter(RequestMeter meter) { meter_ = meter; }

  Response& response() { return response_; }
  // `wire_response` is gRPC's, alive until OnDone.
  void set_wire_response(grpc::ByteBuffer* wire_response) { wire_response_ = wire_response; }

  // Call exactly once, from any thread. Before the handler has returned the reactor to gRPC,
  // gRPC only records the status (OnDone cannot run yet); after, the reactor may be gone when
  // this returns.
  void FinishCall(grpc::Status status) {
    if (status.ok() && wire_response_ != nullptr) {
      status = ToGrpcStatus(SerializeWireMessage(response_, wire_response_));
    }
    meter_.Record(status.error_code());
    HandOff(this);
    Finish(status);
  }
  // The refusal a drain holds for this call (AttendSubmitter::HoldIfDraining): it finishes the
  // call with the status it is given.
  DrainGate::Refusal Refusal() {
    return [this](const absl::Status& status) { FinishCall(ToGrpcStatus(status)); };
  }
  void OnDone() override {
    TakeOver(this);
    OpenCalls* open_calls = open_calls_;
    delete this;
    open_calls->Done();
  }

 private:
  OpenCalls* const open_calls_;
  RequestMeter meter_;
  Response response_;
  grpc::ByteBuffer* wire_response_ = nullptr;
};

// A reactor already finished with `status`, for calls answered in the handler.
template <typename Response>
grpc::ServerUnaryReactor* FinishNow(OpenCalls* open_calls, RequestMeter meter,
                                    const grpc::Status& status) {
  auto* reactor = new UnaryReactor<Response>(open_calls, meter);
  reactor->FinishCall(status);
  return reactor;
}

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_UNARY_REACTOR_H_
