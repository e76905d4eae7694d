#include "server/service/attention_service.h"

#include <chrono>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/util/echo.h"
#include "core/util/happens_before.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/conversion/grpc_status.h"
#include "server/service/attend_stream_reactor.h"
#include "server/service/wire_messages.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

// A unary reactor that deletes itself when the call is done. gRPC's DefaultReactor would serve,
// but its OnDone is gRPC's own, and ThreadSanitizer needs one of ours to see that Finish (often
// on a batch thread) happens before gRPC destroys the call's messages (core/util/happens_before.h).
// The cost is one small allocation per call.
class UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(OpenCalls* open_calls, RequestMeter meter) : open_calls_(open_calls), meter_(meter) {
    open_calls_->Add();
  }
  // Before FinishCall: the meter, when it can only start once the request is parsed.
  void set_meter(RequestMeter meter) { meter_ = meter; }

  // For Attend, whose messages travel as bytes: the response that FinishCall serialises into
  // `wire_response` (gRPC's, alive until OnDone) when the call is OK.
  v1::AttendResponse& response() { return response_; }
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
  void OnDone() override {
    TakeOver(this);
    OpenCalls* open_calls = open_calls_;
    delete this;
    open_calls->Done();
  }

 private:
  OpenCalls* const open_calls_;
  RequestMeter meter_;
  v1::AttendResponse response_;
  grpc::ByteBuffer* wire_response_ = nullptr;
};

grpc::ServerUnaryReactor* FinishNow(OpenCalls* open_calls, RequestMeter meter,
                                    const grpc::Status& status) {
  auto* reactor = new UnaryReactor(open_calls, meter);
  reactor->FinishCall(status);
  return reactor;
}

}  // namespace

AttentionService::AttentionService(const ModelRouter* router, batching::Clock* clock,
                                   metrics::ServerMetrics* metrics, int64_t max_stream_unsent_bytes,
                                   int64_t max_streams_unsent_bytes)
    : submitter_(router, clock, metrics),
      streams_(&open_calls_, max_streams_unsent_bytes),
      max_stream_unsent_bytes_(max_stream_unsent_bytes) {}

AttentionService::~AttentionService() = default;

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request_bytes,
                                                   grpc::ByteBuffer* response_bytes) {
  auto* reactor = new UnaryReactor(&open_calls_, RequestMeter());
  // Parsed into a local, freed when the handler returns: the queued task holds its own copy of
  // the inputs (what the queues' byte budgets count). For the same reason gRPC's copy of the
  // bytes, which it keeps until the call ends, is freed once parsed (gRPC does not read the
  // buffer again; it only destroys it). A queued request so holds its inputs once, not three
  // times. (Nothing may be written to the reactor once Submit has returned OK: the answer can
  // finish the call meanwhile.)
  v1::AttendRequest request;
  const absl::Status parsed = ParseWireMessage(*request_bytes, "request", &request);
  const_cast<grpc::ByteBuffer*>(request_bytes)->Clear();
  if (!parsed.ok()) {
    // No model to count it under: the unknown model's series.
    reactor->set_meter(submitter_.StartMeter(metrics::Method::kAttend, metrics::kUnknownModel));
    spdlog::debug("Attend rejected: {}", parsed.ToString());
    reactor->FinishCall(ToGrpcStatus(parsed));
    return reactor;
  }
  reactor->set_meter(submitter_.StartMeter(metrics::Method::kAttend, request.model()));
  reactor->set_wire_response(response_bytes);
  absl::Status scheduled = submitter_.Submit(
      request, context, [reactor](const AttendWork& work, absl::StatusOr<AttendResult> result) {
        if (!result.ok()) {
          LogFailure(work.model->name, work.request_id, result.status());
          reactor->FinishCall(ToGrpcStatus(result.status()));
          return;
        }
        spdlog::debug(
            "Attend model={} request_id={} sequences={} tokens={} queue_us={} "
            "compute_us={} batch_sequences={}",
            work.model->name, work.request_id, work.sequences(), work.tokens(),
            result->timing.queue_us, result->timing.compute_us, result->timing.batch_sequences);
        reactor->FinishCall(ToGrpcStatus(FillAttendResponse(work, *result, &reactor->response())));
      });
  if (!scheduled.ok()) {
    spdlog::debug("Attend model={} request_id={} rejected: {}", EchoForMessage(request.model()),
                  EchoForMessage(request.request_id()), scheduled.ToString());
    reactor->FinishCall(ToGrpcStatus(scheduled));
  }
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttentionService::AttendStream(
    grpc::CallbackServerContext* context) {
  return new AttendStreamReactor(&submitter_, &streams_, context, max_stream_unsent_bytes_);
}

grpc::ServerUnaryReactor* AttentionService::ListModels(grpc::CallbackServerContext* /*context*/,
                                                       const v1::ListModelsRequest* /*request*/,
                                                       v1::ListModelsResponse* response) {
  const RequestMeter meter = submitter_.StartMeter(metrics::Method::kListModels, "");
  for (const ModelRoute& route : submitter_.router().Routes()) {
    FillModelInfo(*route.model, route.limits, route.is_default, response->add_models());
  }
  return FinishNow(&open_calls_, meter, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AttentionService::GetModel(grpc::CallbackServerContext* /*context*/,
                                                     const v1::GetModelRequest* request,
                                                     v1::ModelInfo* response) {
  const RequestMeter meter = submitter_.StartMeter(metrics::Method::kGetModel, request->name());
  absl::StatusOr<ModelRoute> route = submitter_.router().Route(request->name());
  if (!route.ok()) return FinishNow(&open_calls_, meter, ToGrpcStatus(route.status()));
  FillModelInfo(*route->model, route->limits, route->is_default, response);
  return FinishNow(&open_calls_, meter, grpc::Status::OK);
}

void AttentionService::BeginDrain() {
  submitter_.BeginDrain();
  streams_.DrainAll();
}

}  // namespace attnserve::server
