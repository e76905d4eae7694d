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
#include "server/service/decode_stream_reactor.h"
#include "server/service/unary_reactor.h"
#include "server/service/wire_messages.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

using AttendReactor = UnaryReactor<v1::AttendResponse>;

grpc::ServerUnaryReactor* FinishAttendNow(OpenCalls* open_calls, RequestMeter meter,
                                          const grpc::Status& status) {
  return server::FinishNow<v1::AttendResponse>(open_calls, meter, status);
}

// A stream refused before it starts (finished at once with `status`).
class RefusedStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// A stream opened while the server drains, counted in the open calls until done: it reads
// nothing and is answered (UNAVAILABLE) when the drain releases its held refusals.
class HeldStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit HeldStream(OpenCalls* open_calls) : open_calls_(open_calls) { open_calls_->Add(); }
  DrainGate::Refusal Refusal() {
    return [this](const absl::Status& status) { Finish(ToGrpcStatus(status)); };
  }
  void OnDone() override {
    OpenCalls* open_calls = open_calls_;
    delete this;
    open_calls->Done();
  }

 private:
  OpenCalls* const open_calls_;
};

// Adds to `info` the decoding sessions its version still holds.
void AddDecodeSessions(const decoding::DecodeRuntime* runtime, v1::ModelInfo* info) {
  if (runtime == nullptr) return;
  FillDecodeSessions(runtime->SessionsPerVersion(), info);
}

}  // namespace

AttentionService::AttentionService(const ModelRouter* router, batching::Clock* clock,
                                   metrics::ServerMetrics* metrics, int64_t max_stream_unsent_bytes,
                                   int64_t max_streams_unsent_bytes)
    : submitter_(router, clock, &open_calls_, metrics),
      streams_(&open_calls_, max_streams_unsent_bytes),
      max_stream_unsent_bytes_(max_stream_unsent_bytes) {}

AttentionService::~AttentionService() = default;

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request_bytes,
                                                   grpc::ByteBuffer* response_bytes) {
  auto* reactor = new AttendReactor(&open_calls_, RequestMeter());
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
  if (DrainGate::Refusal refusal = reactor->Refusal(); submitter_.HoldIfDraining(refusal)) {
    return reactor;
  }
  // The answer is serialised into gRPC's response bytes straight from the result (one copy of its
  // floats), not through reactor->response().
  absl::Status scheduled = submitter_.Submit(
      request, context,
      [reactor, response_bytes](const AttendWork& work, absl::StatusOr<AttendResult> result) {
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
        reactor->FinishCall(ToGrpcStatus(SerializeAttendResponse(work, *result, response_bytes)));
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
  if (submitter_.draining()) return HoldStream();
  return new AttendStreamReactor(&submitter_, &streams_, context, max_stream_unsent_bytes_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttentionService::Decode(
    grpc::CallbackServerContext* /*context*/) {
  if (decode_runtime_ == nullptr) {
    return new RefusedStream(
        grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "Decode: decoding sessions are not enabled"));
  }
  if (submitter_.draining()) return HoldStream();
  return new DecodeStreamReactor(decode_runtime_, &submitter_, &streams_,
                                 next_decode_owner_.fetch_add(1), max_stream_unsent_bytes_);
}

grpc::ServerUnaryReactor* AttentionService::ListModels(grpc::CallbackServerContext* /*context*/,
                                                       const v1::ListModelsRequest* /*request*/,
                                                       v1::ListModelsResponse* response) {
  const RequestMeter meter = submitter_.StartMeter(metrics::Method::kListModels, "");
  for (const ModelRoute& route : submitter_.router().Routes()) {
    v1::ModelInfo* info = response->add_models();
    FillModelInfo(*route.model, route.limits, route.is_default, info);
    AddDecodeSessions(decode_runtime_, info);
  }
  return FinishAttendNow(&open_calls_, meter, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AttentionService::GetModel(grpc::CallbackServerContext* /*context*/,
                                                     const v1::GetModelRequest* request,
                                                     v1::ModelInfo* response) {
  const RequestMeter meter = submitter_.StartMeter(metrics::Method::kGetModel, request->name());
  absl::StatusOr<ModelRoute> route = submitter_.router().Route(request->name());
  if (!route.ok()) return FinishAttendNow(&open_calls_, meter, ToGrpcStatus(route.status()));
  FillModelInfo(*route->model, route->limits, route->is_default, response);
  AddDecodeSessions(decode_runtime_, response);
  return FinishAttendNow(&open_calls_, meter, grpc::Status::OK);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttentionService::HoldStream() {
  auto* stream = new HeldStream(&open_calls_);
  DrainGate::Refusal refusal = stream->Refusal();
  // Draining never ends, so this holds (or, once released, answers at once).
  submitter_.HoldIfDraining(refusal);
  return stream;
}

void AttentionService::BeginDrain() {
  submitter_.BeginDrain();
  streams_.DrainAll();
}

}  // namespace attnserve::server
