// InferClient over a gRPC channel (built as Client's): the implementation behind
// InferClient::Create.
#include "attnserve/client/infer_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <utility>

#include "client/src/channel.h"
#include "client/src/infer_conversion.h"
#include "core/util/happens_before.h"
#include "inference/grpc_predict_v2.grpc.pb.h"

namespace attnserve::client {
namespace {

using Clock = std::chrono::steady_clock;

class GrpcInferClient final : public InferClient {
 public:
  GrpcInferClient(const std::shared_ptr<grpc::Channel>& channel, const ClientOptions& options)
      : options_(options), stub_(inference::GRPCInferenceService::NewStub(channel)) {}

  absl::StatusOr<InferResult> Infer(std::string_view model, TensorView input,
                                    const InferOptions& options) override {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<inference::ModelInferRequest> request =
        internal::MakeModelInferRequest(model, input, options);
    if (!request.ok()) return request.status();
    grpc::ClientContext context;
    SetDeadline(options.deadline, &context);
    inference::ModelInferResponse response;
    const grpc::Status status = stub_->ModelInfer(&context, *request, &response);
    if (!status.ok()) return internal::FromGrpc(status);
    absl::StatusOr<InferResult> result = internal::ReadModelInferResponse(response);
    if (result.ok()) result->latency = internal::MicrosecondsSince(start);
    return result;
  }

  void InferAsync(std::string_view model, TensorView input, const InferOptions& options,
                  Callback done) override {
    // Everything the call needs, alive until its callback has run.
    struct Call {
      grpc::ClientContext context;
      inference::ModelInferRequest request;
      inference::ModelInferResponse response;
      Callback done;
      Clock::time_point start;
    };
    auto call = std::make_unique<Call>();
    call->start = Clock::now();
    absl::StatusOr<inference::ModelInferRequest> request =
        internal::MakeModelInferRequest(model, input, options);
    if (!request.ok()) {
      done(request.status());
      return;
    }
    call->request = *std::move(request);
    call->done = std::move(done);
    SetDeadline(options.deadline, &call->context);
    Call* raw = call.release();
    HandOff(raw);  // To the callback, on a gRPC thread (core/util/happens_before.h).
    stub_->async()->ModelInfer(&raw->context, &raw->request, &raw->response,
                               [raw](grpc::Status status) {
                                 TakeOver(raw);
                                 std::unique_ptr<Call> owned(raw);
                                 absl::StatusOr<InferResult> result =
                                     status.ok() ? internal::ReadModelInferResponse(owned->response)
                                                 : internal::FromGrpc(status);
                                 if (result.ok())
                                   result->latency = internal::MicrosecondsSince(owned->start);
                                 owned->done(std::move(result));
                               });
  }

 private:
  void SetDeadline(std::chrono::milliseconds deadline, grpc::ClientContext* context) const {
    context->set_deadline(std::chrono::system_clock::now() +
                          (deadline.count() > 0 ? deadline : options_.default_deadline));
  }

  const ClientOptions options_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<InferClient>> InferClient::Create(const std::string& target,
                                                                 const ClientOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = internal::MakeChannel(target, options);
  if (!channel.ok()) return channel.status();
  return std::make_unique<GrpcInferClient>(*channel, options);
}

}  // namespace attnserve::client
