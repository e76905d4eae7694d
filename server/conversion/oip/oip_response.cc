// oip_conversion.h, response side: AttendResult -> ModelInferResponse, and ModelMetadata.
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attnserve/v1/attention.pb.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/conversion/oip/oip_conversion.h"

namespace attnserve::server::oip {
namespace {

void SetInt64(inference::ModelInferResponse* response, const std::string& name, int64_t value) {
  (*response->mutable_parameters())[name].set_int64_param(value);
}

// Moves `tensor`'s raw float32 bytes (v1's padded answer) into `response` as output `name`.
void AddOutput(const std::string& name, v1::Tensor* tensor, bool raw,
               inference::ModelInferResponse* response) {
  auto* output = response->add_outputs();
  output->set_name(name);
  output->set_datatype("FP32");
  output->mutable_shape()->CopyFrom(tensor->shape());
  std::string* bytes = tensor->mutable_raw();
  if (raw) {
    response->add_raw_output_contents()->swap(*bytes);
    return;
  }
  auto* values = output->mutable_contents()->mutable_fp32_contents();
  values->Resize(static_cast<int>(bytes->size() / sizeof(float)), 0.0f);
  std::memcpy(values->mutable_data(), bytes->data(), bytes->size());
}

void AddMetadata(
    const std::string& name, const std::string& datatype, std::initializer_list<int64_t> shape,
    google::protobuf::RepeatedPtrField<inference::ModelMetadataResponse::TensorMetadata>* tensors) {
  auto* tensor = tensors->Add();
  tensor->set_name(name);
  tensor->set_datatype(datatype);
  for (int64_t dim : shape) tensor->add_shape(dim);
}

}  // namespace

absl::Status FillModelInferResponse(const AttendWork& work, const AttendResult& result,
                                    const InferAnswer& answer,
                                    inference::ModelInferResponse* response) {
  // attnserve.v1's padding into raw float32 bytes (work.raw_output is set), then moved over.
  v1::AttendResponse attend;
  if (auto s = FillAttendResponse(work, result, &attend); !s.ok()) return s;
  response->set_model_name(work.model->name);
  response->set_model_version(absl::StrCat(work.model->version));
  response->set_id(work.request_id);
  if (answer.output) AddOutput("output", attend.mutable_output(), answer.raw, response);
  if (answer.weights) AddOutput("weights", attend.mutable_weights(), answer.raw, response);
  SetInt64(response, "queue_us", result.timing.queue_us);
  SetInt64(response, "compute_us", result.timing.compute_us);
  SetInt64(response, "batch_sequences", result.timing.batch_sequences);
  return absl::OkStatus();
}

void FillModelMetadata(const model::Model& model, inference::ModelMetadataResponse* response) {
  const int64_t d = model.config.attention.d_model;
  const int64_t h = model.config.attention.num_heads;
  response->Clear();
  response->set_name(model.name);
  response->add_versions(absl::StrCat(model.version));
  response->set_platform(std::string(kPlatform));
  // The batched forms; [T, d_model] (and [T, S] masks, [h, T, S] weights) are accepted too.
  auto* inputs = response->mutable_inputs();
  AddMetadata("input", "FP32", {-1, -1, d}, inputs);
  AddMetadata("memory", "FP32", {-1, -1, d}, inputs);
  AddMetadata("lengths", "INT32", {-1}, inputs);
  AddMetadata("memory_lengths", "INT32", {-1}, inputs);
  AddMetadata("attn_mask", "BOOL", {-1, -1, -1}, inputs);
  auto* outputs = response->mutable_outputs();
  AddMetadata("output", "FP32", {-1, -1, d}, outputs);
  AddMetadata("weights", "FP32", {-1, h, -1, -1}, outputs);
}

}  // namespace attnserve::server::oip
