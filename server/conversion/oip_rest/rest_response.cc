// rest_conversion.h, answer side: inference messages -> REST JSON (and binary data).
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/util/json_numbers.h"
#include "nlohmann/json.hpp"
#include "server/conversion/oip_rest/rest_conversion.h"

namespace attnserve::server::oip_rest {
namespace {

using Json = nlohmann::json;

// A JSON string literal (quoted, escaped); invalid UTF-8 is replaced rather than refused, since
// names and ids echo what clients sent.
std::string JsonString(std::string_view text) {
  return Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
}

void AppendShape(const google::protobuf::RepeatedField<int64_t>& shape, std::string* out) {
  out->push_back('[');
  for (int i = 0; i < shape.size(); ++i) absl::StrAppend(out, i == 0 ? "" : ",", shape[i]);
  out->push_back(']');
}

// The float values of output `index`: its raw bytes or its typed contents.
std::span<const float> OutputValues(const inference::ModelInferResponse& response, int index,
                                    std::vector<float>* storage) {
  if (index < response.raw_output_contents_size()) {
    const std::string& raw = response.raw_output_contents(index);
    storage->resize(raw.size() / sizeof(float));
    if (!raw.empty()) std::memcpy(storage->data(), raw.data(), storage->size() * sizeof(float));
    return *storage;
  }
  const auto& values = response.outputs(index).contents().fp32_contents();
  return {values.data(), static_cast<size_t>(values.size())};
}

void AppendParameter(const std::string& name, const inference::InferParameter& value,
                     std::string* out) {
  absl::StrAppend(out, JsonString(name), ":");
  switch (value.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam:
      absl::StrAppend(out, value.bool_param() ? "true" : "false");
      break;
    case inference::InferParameter::kInt64Param:
      absl::StrAppend(out, value.int64_param());
      break;
    case inference::InferParameter::kUint64Param:
      absl::StrAppend(out, value.uint64_param());
      break;
    case inference::InferParameter::kDoubleParam:
      absl::StrAppend(out, Json(value.double_param()).dump());
      break;
    default:
      absl::StrAppend(out, JsonString(value.string_param()));
  }
}

Json TensorsJson(
    const google::protobuf::RepeatedPtrField<inference::ModelMetadataResponse::TensorMetadata>&
        tensors) {
  Json list = Json::array();
  for (const auto& tensor : tensors) {
    list.push_back({{"name", tensor.name()},
                    {"datatype", tensor.datatype()},
                    {"shape", std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end())}});
  }
  return list;
}

}  // namespace

RestBody WriteInferResponse(const inference::ModelInferResponse& response,
                            const BinaryOutputs& binary) {
  RestBody answer;
  std::string& json = answer.bytes;
  std::string data;  // The binary outputs, appended after the JSON.
  absl::StrAppend(&json, "{\"model_name\":", JsonString(response.model_name()),
                  ",\"model_version\":", JsonString(response.model_version()));
  if (!response.id().empty()) absl::StrAppend(&json, ",\"id\":", JsonString(response.id()));
  if (!response.parameters().empty()) {
    json.append(",\"parameters\":{");
    bool first = true;
    // Sorted, so that answers are stable to compare.
    std::map<std::string, const inference::InferParameter*> sorted;
    for (const auto& [name, value] : response.parameters()) sorted[name] = &value;
    for (const auto& [name, value] : sorted) {
      if (!first) json.push_back(',');
      first = false;
      AppendParameter(name, *value, &json);
    }
    json.push_back('}');
  }
  json.append(",\"outputs\":[");
  std::vector<float> storage;
  bool any_binary = false;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& output = response.outputs(i);
    absl::StrAppend(&json, i == 0 ? "" : ",", "{\"name\":", JsonString(output.name()),
                    ",\"datatype\":", JsonString(output.datatype()), ",\"shape\":");
    AppendShape(output.shape(), &json);
    const bool as_binary = output.name() == "weights" ? binary.weights : binary.output;
    const std::span<const float> values = OutputValues(response, i, &storage);
    if (as_binary) {
      any_binary = true;
      const size_t bytes = values.size() * sizeof(float);
      absl::StrAppend(&json, ",\"parameters\":{\"binary_data_size\":", bytes, "}}");
      data.append(reinterpret_cast<const char*>(values.data()), bytes);
    } else {
      json.append(",\"data\":");
      AppendJsonFloats(values, &json);
      json.push_back('}');
    }
  }
  json.append("]}");
  if (any_binary) {
    answer.json_length = json.size();
    json.append(data);
  }
  return answer;
}

std::string ServerMetadataJson(const inference::ServerMetadataResponse& metadata) {
  return Json{{"name", metadata.name()},
              {"version", metadata.version()},
              {"extensions", std::vector<std::string>(metadata.extensions().begin(),
                                                      metadata.extensions().end())}}
      .dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ModelMetadataJson(const inference::ModelMetadataResponse& metadata) {
  return Json{{"name", metadata.name()},
              {"versions",
               std::vector<std::string>(metadata.versions().begin(), metadata.versions().end())},
              {"platform", metadata.platform()},
              {"inputs", TensorsJson(metadata.inputs())},
              {"outputs", TensorsJson(metadata.outputs())}}
      .dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ErrorJson(std::string_view message) {
  return absl::StrCat("{\"error\":", JsonString(message), "}");
}

}  // namespace attnserve::server::oip_rest
