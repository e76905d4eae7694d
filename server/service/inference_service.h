// InferenceService: the gRPC handlers of the Open Inference Protocol
// (inference.GRPCInferenceService, KServe v2), served beside attnserve.v1 on the same port.
//
// ModelInfer takes the same path as Attend: the shared AttendSubmitter (route, validate, the
// model's batch queue and limits, metrics under method="ModelInfer", drain), with the protocol's
// own conversion (server/conversion/oip/). Readiness and metadata answer from the router.
// No handler blocks; every RPC is finished exactly once.
//
// Thread-safe. The submitter and open_calls (those of the AttentionService, so one drain covers
// both protocols) must outlive the service.
#ifndef ATTNSERVE_SERVER_SERVICE_INFERENCE_SERVICE_H_
#define ATTNSERVE_SERVER_SERVICE_INFERENCE_SERVICE_H_

#include <string>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/service/attend_submitter.h"
#include "server/service/open_calls.h"

namespace attnserve::server {

using InferenceServiceBase = inference::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
    inference::GRPCInferenceService::WithCallbackMethod_ServerLive<
        inference::GRPCInferenceService::WithCallbackMethod_ServerReady<
            inference::GRPCInferenceService::WithCallbackMethod_ModelReady<
                inference::GRPCInferenceService::WithCallbackMethod_ServerMetadata<
                    inference::GRPCInferenceService::WithCallbackMethod_ModelMetadata<
                        inference::GRPCInferenceService::Service>>>>>>;

// What ServerMetadata reports.
struct InferenceServerIdentity {
  std::string name = "attnserve";
  std::string version = "";  // the server's release, e.g. "0.1.0"
};

class InferenceService final : public InferenceServiceBase {
 public:
  InferenceService(AttendSubmitter* submitter, OpenCalls* open_calls,
                   InferenceServerIdentity identity);

  // Live while the process serves; ready while not draining and some model serves.
  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  // Ready when `name` ("" = the default model) serves, at `version` if one is given.
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  // NOT_FOUND (listing the serving models) for an unknown model or version.
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  // Bytes in and out, parsed here so that an unparseable message is answered INVALID_ARGUMENT.
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

 private:
  AttendSubmitter* const submitter_;
  OpenCalls* const open_calls_;
  const InferenceServerIdentity identity_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_INFERENCE_SERVICE_H_
