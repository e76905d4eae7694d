#include "server/conversion/oip_rest/rest_infer.h"

#include <utility>

#include "nlohmann/json.hpp"
#include "server/conversion/oip/oip_conversion.h"

namespace attnserve::server::oip_rest {

struct RestInfer::Impl {
  inference::ModelInferRequest request;
  BinaryOutputs binary;
  oip::InferAnswer answer;
  inference::ModelInferResponse response;  // Answer's, for Body.
};

RestInfer::RestInfer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RestInfer::~RestInfer() = default;

absl::StatusOr<std::unique_ptr<RestInfer>> RestInfer::Parse(std::string_view model_name,
                                                            std::string_view version,
                                                            std::string_view body,
                                                            const std::string* header_length) {
  std::optional<size_t> json_length;
  if (header_length != nullptr) {
    absl::StatusOr<size_t> parsed = ParseHeaderLength(*header_length, body.size());
    if (!parsed.ok()) return parsed.status();
    json_length = *parsed;
  }
  auto impl = std::make_unique<Impl>();
  if (absl::Status s =
          ParseInferRequest(model_name, version, body, json_length, &impl->request, &impl->binary);
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<RestInfer>(new RestInfer(std::move(impl)));
}

absl::StatusOr<AttendWork> RestInfer::ToWork(const ModelRoute& route) {
  return oip::ParseModelInferRequest(&impl_->request, route.model, route.limits, &impl_->answer);
}

absl::Status RestInfer::Answer(const AttendWork& work, const AttendResult& result) {
  return oip::FillModelInferResponse(work, result, impl_->answer, &impl_->response);
}

absl::StatusOr<RestBody> RestInfer::Body() const {
  return WriteInferResponse(impl_->response, impl_->binary);
}

const std::string& RestInfer::id() const { return impl_->request.id(); }

std::string ServerMetadataBody(std::string_view name, std::string_view version) {
  inference::ServerMetadataResponse metadata;
  metadata.set_name(std::string(name));
  metadata.set_version(std::string(version));
  metadata.add_extensions("binary_tensor_data");
  return ServerMetadataJson(metadata);
}

std::string ModelReadyBody(std::string_view name, bool ready) {
  return nlohmann::json{{"name", std::string(name)}, {"ready", ready}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ModelMetadataBody(const model::Model& model) {
  inference::ModelMetadataResponse metadata;
  oip::FillModelMetadata(model, &metadata);
  return ModelMetadataJson(metadata);
}

}  // namespace attnserve::server::oip_rest
