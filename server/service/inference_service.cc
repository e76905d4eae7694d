#include "server/service/inference_service.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/echo.h"
#include "core/util/happens_before.h"
#include "server/conversion/grpc_status.h"
#include "server/conversion/oip/oip_conversion.h"
#include "server/service/unary_reactor.h"
#include "server/service/wire_messages.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

using InferReactor = UnaryReactor<inference::ModelInferResponse>;

grpc::ServerUnaryReactor* FinishInferNow(OpenCalls* open_calls, RequestMeter meter,
                                         const grpc::Status& status) {
  return server::FinishNow<inference::ModelInferResponse>(open_calls, meter, status);
}

}  // namespace

InferenceService::InferenceService(AttendSubmitter* submitter, OpenCalls* open_calls,
                                   InferenceServerIdentity identity)
    : submitter_(submitter), open_calls_(open_calls), identity_(std::move(identity)) {}

grpc::ServerUnaryReactor* InferenceService::ServerLive(grpc::CallbackServerContext* /*context*/,
                                                       const inference::ServerLiveRequest*,
                                                       inference::ServerLiveResponse* response) {
  response->set_live(true);
  return FinishInferNow(open_calls_, RequestMeter(), grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* /*context*/,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* response) {
  response->set_ready(!submitter_->draining() && !submitter_->router().Routes().empty());
  return FinishInferNow(open_calls_, RequestMeter(), grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* /*context*/,
                                                       const inference::ModelReadyRequest* request,
                                                       inference::ModelReadyResponse* response) {
  absl::StatusOr<ModelRoute> route = submitter_->router().Route(request->name());
  response->set_ready(
      !submitter_->draining() && route.ok() &&
      (request->version().empty() || request->version() == absl::StrCat(route->model->version)));
  return FinishInferNow(open_calls_, RequestMeter(), grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* /*context*/, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  response->set_name(identity_.name);
  response->set_version(identity_.version);
  return FinishInferNow(open_calls_, RequestMeter(), grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* /*context*/, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  const RequestMeter meter =
      submitter_->StartMeter(metrics::Method::kModelMetadata, request->name());
  absl::StatusOr<ModelRoute> route = submitter_->router().Route(request->name());
  if (!route.ok()) return FinishInferNow(open_calls_, meter, ToGrpcStatus(route.status()));
  if (!request->version().empty() && request->version() != absl::StrCat(route->model->version)) {
    return FinishInferNow(
        open_calls_, meter,
        ToGrpcStatus(absl::NotFoundError(absl::StrCat(
            "version: expected \"", route->model->version, "\" (the serving version of model \"",
            route->model->name, "\") or \"\", got \"", EchoForMessage(request->version()), "\""))));
  }
  oip::FillModelMetadata(*route->model, response);
  return FinishInferNow(open_calls_, meter, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request_bytes,
                                                       grpc::ByteBuffer* response_bytes) {
  auto* reactor = new InferReactor(open_calls_, RequestMeter());
  // A local, freed when the handler returns, and gRPC's bytes freed once parsed: as Attend does.
  inference::ModelInferRequest request;
  const absl::Status parsed = ParseWireMessage(*request_bytes, "request", &request);
  const_cast<grpc::ByteBuffer*>(request_bytes)->Clear();
  if (!parsed.ok()) {
    reactor->set_meter(
        submitter_->StartMeter(metrics::Method::kModelInfer, metrics::kUnknownModel));
    reactor->FinishCall(ToGrpcStatus(parsed));
    return reactor;
  }
  reactor->set_meter(submitter_->StartMeter(metrics::Method::kModelInfer, request.model_name()));
  if (DrainGate::Refusal refusal = reactor->Refusal(); submitter_->HoldIfDraining(refusal)) {
    return reactor;
  }
  reactor->set_wire_response(response_bytes);
  auto answer = std::make_shared<oip::InferAnswer>();
  const auto parse = [&request, &answer](const ModelRoute& route) {
    return oip::ParseModelInferRequest(&request, route.model, route.limits, answer.get());
  };
  // Nothing may touch the reactor once this returns OK: the answer may finish the call.
  absl::Status scheduled = submitter_->SubmitParsed(
      request.model_name(), parse, context,
      [reactor, answer](const AttendWork& work, absl::StatusOr<AttendResult> result) {
        if (!result.ok()) {
          LogFailure(work.model->name, work.request_id, result.status());
          reactor->FinishCall(ToGrpcStatus(result.status()));
          return;
        }
        reactor->FinishCall(ToGrpcStatus(
            oip::FillModelInferResponse(work, *result, *answer, &reactor->response())));
      });
  if (!scheduled.ok()) {
    spdlog::debug("ModelInfer model={} id={} rejected: {}", EchoForMessage(request.model_name()),
                  EchoForMessage(request.id()), scheduled.ToString());
    reactor->FinishCall(ToGrpcStatus(scheduled));
  }
  return reactor;
}

}  // namespace attnserve::server
