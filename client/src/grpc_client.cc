// Client over a gRPC channel: the implementation behind Client::Create.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attnserve/client/client.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "client/src/attend_session.h"
#include "client/src/channel.h"
#include "client/src/conversion.h"
#include "client/src/decode_stream.h"
#include "core/util/happens_before.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace attnserve::client {
namespace {

using Clock = std::chrono::steady_clock;

class GrpcClient final : public Client {
 public:
  GrpcClient(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
      : options_(options),
        channel_(std::move(channel)),
        stub_(v1::AttentionService::NewStub(channel_)),
        health_(grpc::health::v1::Health::NewStub(channel_)) {}

  absl::StatusOr<AttendResult> Attend(std::string_view model, TensorView input,
                                      const AttendOptions& options) override {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<v1::AttendRequest> request = internal::MakeAttendRequest(model, input, options);
    if (!request.ok()) return request.status();
    grpc::ClientContext context;
    SetDeadline(options.deadline, &context);
    v1::AttendResponse response;
    const grpc::Status status = stub_->Attend(&context, *request, &response);
    if (!status.ok()) return internal::FromGrpc(status);
    absl::StatusOr<AttendResult> result = internal::ReadAttendResponse(response);
    if (result.ok()) {
      result->latency = internal::MicrosecondsSince(start);
      result->request_bytes = static_cast<int64_t>(request->ByteSizeLong());
    }
    return result;
  }

  void AttendAsync(std::string_view model, TensorView input, const AttendOptions& options,
                   Callback done) override {
    // Everything the call needs, alive until its callback has run.
    struct Call {
      grpc::ClientContext context;
      v1::AttendRequest request;
      v1::AttendResponse response;
      Callback done;
      Clock::time_point start;
    };
    auto call = std::make_unique<Call>();
    call->start = Clock::now();
    absl::StatusOr<v1::AttendRequest> request = internal::MakeAttendRequest(model, input, options);
    if (!request.ok()) {
      done(request.status());
      return;
    }
    call->request = *std::move(request);
    call->done = std::move(done);
    SetDeadline(options.deadline, &call->context);
    Call* raw = call.release();
    HandOff(raw);  // To the callback, on a gRPC thread (core/util/happens_before.h).
    stub_->async()->Attend(
        &raw->context, &raw->request, &raw->response, [raw](grpc::Status status) {
          TakeOver(raw);
          std::unique_ptr<Call> owned(raw);
          absl::StatusOr<AttendResult> result = status.ok()
                                                    ? internal::ReadAttendResponse(owned->response)
                                                    : internal::FromGrpc(status);
          if (result.ok()) {
            result->latency = internal::MicrosecondsSince(owned->start);
            result->request_bytes = static_cast<int64_t>(owned->request.ByteSizeLong());
          }
          owned->done(std::move(result));
        });
  }

  absl::StatusOr<std::unique_ptr<AttendSession>> OpenSession(int max_in_flight) override {
    if (max_in_flight < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_in_flight: expected >= 1, got ", max_in_flight));
    }
    return std::make_unique<internal::StreamSession>(stub_.get(), max_in_flight);
  }

  absl::StatusOr<std::unique_ptr<DecodeStream>> OpenDecodeStream(
      const DecodeStreamOptions& options) override {
    if (options.max_in_flight < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_in_flight: expected >= 1, got ", options.max_in_flight));
    }
    return std::make_unique<internal::GrpcDecodeStream>(stub_.get(), options);
  }

  absl::StatusOr<std::vector<ModelInfo>> ListModels() override {
    grpc::ClientContext context;
    SetDeadline(std::chrono::milliseconds(0), &context);
    v1::ListModelsResponse response;
    const grpc::Status status = stub_->ListModels(&context, v1::ListModelsRequest(), &response);
    if (!status.ok()) return internal::FromGrpc(status);
    std::vector<ModelInfo> models;
    for (const v1::ModelInfo& info : response.models()) {
      models.push_back(internal::ReadModelInfo(info));
    }
    return models;
  }

  absl::StatusOr<ModelInfo> GetModel(std::string_view name) override {
    grpc::ClientContext context;
    SetDeadline(std::chrono::milliseconds(0), &context);
    v1::GetModelRequest request;
    request.set_name(std::string(name));
    v1::ModelInfo info;
    const grpc::Status status = stub_->GetModel(&context, request, &info);
    if (!status.ok()) return internal::FromGrpc(status);
    return internal::ReadModelInfo(info);
  }

  absl::Status Health(std::string_view service) override {
    grpc::ClientContext context;
    SetDeadline(std::chrono::milliseconds(0), &context);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(std::string(service));
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = health_->Check(&context, request, &response);
    if (!status.ok()) return internal::FromGrpc(status);
    if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::UnavailableError(absl::StrCat(
          "health of \"", request.service(),
          "\": ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())));
    }
    return absl::OkStatus();
  }

 private:
  void SetDeadline(std::chrono::milliseconds deadline, grpc::ClientContext* context) const {
    context->set_deadline(std::chrono::system_clock::now() +
                          (deadline.count() > 0 ? deadline : options_.default_deadline));
  }

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& target,
                                                       const ClientOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = internal::MakeChannel(target, options);
  if (!channel.ok()) return channel.status();
  return std::make_unique<GrpcClient>(*std::move(channel), options);
}

absl::StatusOr<std::unique_ptr<DecodeSession>> Client::OpenDecodeSession(
    const DecodeOpen& open, const DecodeStreamOptions& options) {
  absl::StatusOr<std::unique_ptr<DecodeStream>> stream = OpenDecodeStream(options);
  if (!stream.ok()) return stream.status();
  return DecodeSession::Open(*std::move(stream), open);
}

std::future<absl::StatusOr<AttendResult>> Client::AttendAsync(std::string_view model,
                                                              TensorView input,
                                                              const AttendOptions& options) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<AttendResult>>>();
  std::future<absl::StatusOr<AttendResult>> future = promise->get_future();
  AttendAsync(model, input, options, [promise](absl::StatusOr<AttendResult> result) {
    promise->set_value(std::move(result));
  });
  return future;
}

}  // namespace attnserve::client
