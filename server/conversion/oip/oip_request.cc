// oip_conversion.h, request side: ModelInferRequest -> attnserve.v1 AttendRequest -> AttendWork.
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attention.pb.h"
#include "core/util/checked_math.h"
#include "core/util/echo.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/conversion/attnserve_v1/conversion_internal.h"
#include "server/conversion/oip/oip_conversion.h"

namespace attnserve::server::oip {
namespace {

using conversion_internal::Internal;
using conversion_internal::Invalid;
using InputTensor = inference::ModelInferRequest::InferInputTensor;

constexpr int kMaxShownDims = 6;

std::string FormatShape(std::span<const int64_t> shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size() && i < kMaxShownDims; ++i) {
    absl::StrAppend(&text, i == 0 ? "" : ", ", shape[i]);
  }
  if (shape.size() > kMaxShownDims) absl::StrAppend(&text, ", ...");
  return absl::StrCat(text, "]");
}

// Client strings are quoted through EchoForMessage: a status message travels in metadata, whose
// default limit (8 KiB) a long name would exceed, turning the real error into RESOURCE_EXHAUSTED.
std::string TensorName(const std::string& name) {
  return absl::StrCat("inputs[\"", EchoForMessage(name), "\"]");
}
std::string ParameterName(const std::string& name) {
  return absl::StrCat("parameters[\"", EchoForMessage(name), "\"]");
}

// What a request tensor may be, by name.
struct TensorKind {
  absl::string_view name;
  absl::string_view datatypes;  // accepted, for messages
};
constexpr TensorKind kInputKinds[] = {{"input", "FP32, BF16 or FP16"},
                                      {"memory", "FP32, BF16 or FP16"},
                                      {"lengths", "INT32"},
                                      {"memory_lengths", "INT32"},
                                      {"attn_mask", "BOOL or UINT8"}};

// The element count of `tensor`'s shape: every dim > 0, no overflow.
absl::StatusOr<int64_t> ElementCount(const InputTensor& tensor) {
  const std::string name = TensorName(tensor.name());
  if (tensor.shape_size() == 0) return Invalid(name, ".shape: expected rank >= 1, got rank 0");
  for (int i = 0; i < tensor.shape_size(); ++i) {
    if (tensor.shape(i) <= 0) {
      return Invalid(name, ".shape[", i, "]: expected > 0, got ", tensor.shape(i));
    }
  }
  const std::optional<int64_t> count =
      CheckedProduct(std::span<const int64_t>(tensor.shape().data(), tensor.shape_size()));
  if (!count) {
    return Invalid(name, ".shape: expected fewer than 2^63 elements, got shape ",
                   FormatShape({tensor.shape().data(), static_cast<size_t>(tensor.shape_size())}));
  }
  return *count;
}

// Where one tensor's data is: raw bytes (null when typed) or its typed contents.
struct TensorData {
  InputTensor* tensor;
  std::string* raw;  // null: the data is in tensor->contents()
  int64_t count = 0;
};

absl::Status CheckRawSize(const TensorData& data, int element_bytes) {
  // The shape's element count fits in int64, its byte size need not.
  const std::optional<int64_t> expected = CheckedProduct({data.count, element_bytes});
  if (expected && static_cast<int64_t>(data.raw->size()) == *expected) return absl::OkStatus();
  return Invalid(
      TensorName(data.tensor->name()), " (raw_input_contents): expected ",
      expected ? absl::StrCat(*expected) : "more than 2^63", " bytes (", data.count, " ",
      EchoForMessage(data.tensor->datatype()), " elements of shape ",
      FormatShape({data.tensor->shape().data(), static_cast<size_t>(data.tensor->shape_size())}),
      "), got ", data.raw->size());
}

absl::Status CheckTypedCount(const TensorData& data, absl::string_view field, int64_t got) {
  if (got == data.count) return absl::OkStatus();
  return Invalid(
      TensorName(data.tensor->name()), ".contents.", field, ": expected ", data.count,
      " elements (the product of shape ",
      FormatShape({data.tensor->shape().data(), static_cast<size_t>(data.tensor->shape_size())}),
      "), got ", got);
}

absl::Status CheckDatatype(const InputTensor& tensor, absl::string_view expected) {
  if (tensor.datatype() == expected) return absl::OkStatus();
  return Invalid(TensorName(tensor.name()), ".datatype: expected ", expected, ", got \"",
                 EchoForMessage(tensor.datatype()), "\"");
}

// `input` / `memory` into a v1 tensor, moving the data: FP32, or BF16 / FP16 in
// raw_input_contents (the protocol has no typed contents for them), widened by
// ParseAttendRequest as attnserve.v1's Tensor.raw with that dtype.
absl::Status ToFloatTensor(const TensorData& data, v1::Tensor* out) {
  const std::string& type = data.tensor->datatype();
  const v1::DataType dtype = type == "BF16"   ? v1::DATA_TYPE_BF16
                             : type == "FP16" ? v1::DATA_TYPE_FP16
                                              : v1::DATA_TYPE_FP32;
  if (dtype == v1::DATA_TYPE_FP32) {
    if (auto s = CheckDatatype(*data.tensor, "FP32"); !s.ok()) {
      return Invalid(TensorName(data.tensor->name()), ".datatype: expected FP32, BF16 or FP16, ",
                     "got \"", EchoForMessage(type), "\"");
    }
  } else if (data.raw == nullptr) {
    return Invalid(TensorName(data.tensor->name()), ".datatype: expected FP32 in contents (", type,
                   " only in raw_input_contents), got \"", type, "\"");
  }
  if (data.raw != nullptr) {
    const int element_bytes = dtype == v1::DATA_TYPE_FP32 ? 4 : 2;
    if (auto s = CheckRawSize(data, element_bytes); !s.ok()) return s;
    out->mutable_raw()->swap(*data.raw);
    out->set_dtype(dtype);
  } else {
    auto* values = data.tensor->mutable_contents()->mutable_fp32_contents();
    if (auto s = CheckTypedCount(data, "fp32_contents", values->size()); !s.ok()) return s;
    out->mutable_values()->Swap(values);
  }
  out->mutable_shape()->CopyFrom(data.tensor->shape());
  return absl::OkStatus();
}

// INT32 [B] `lengths` / `memory_lengths`.
absl::Status ToLengths(const TensorData& data, google::protobuf::RepeatedField<int32_t>* out) {
  if (auto s = CheckDatatype(*data.tensor, "INT32"); !s.ok()) return s;
  if (data.tensor->shape_size() != 1) {
    return Invalid(TensorName(data.tensor->name()), ".shape: expected rank 1 ([B]), got rank ",
                   data.tensor->shape_size());
  }
  if (data.raw != nullptr) {
    if (auto s = CheckRawSize(data, 4); !s.ok()) return s;
    out->Resize(static_cast<int>(data.count), 0);
    std::memcpy(out->mutable_data(), data.raw->data(), data.raw->size());
  } else {
    auto* values = data.tensor->mutable_contents()->mutable_int_contents();
    if (auto s = CheckTypedCount(data, "int_contents", values->size()); !s.ok()) return s;
    out->Swap(values);
  }
  return absl::OkStatus();
}

// BOOL or UINT8 `attn_mask` (non-zero = visible) into v1's float mask.
absl::Status ToMask(const TensorData& data, v1::Tensor* out) {
  const std::string& type = data.tensor->datatype();
  if (type != "BOOL" && type != "UINT8") {
    return Invalid(TensorName(data.tensor->name()), ".datatype: expected BOOL or UINT8, got \"",
                   EchoForMessage(type), "\"");
  }
  auto* values = out->mutable_values();
  if (data.raw != nullptr) {
    if (auto s = CheckRawSize(data, 1); !s.ok()) return s;
    values->Reserve(static_cast<int>(data.count));
    for (char byte : *data.raw) values->AddAlreadyReserved(byte != 0 ? 1.0f : 0.0f);
  } else if (type == "BOOL") {
    const auto& flags = data.tensor->contents().bool_contents();
    if (auto s = CheckTypedCount(data, "bool_contents", flags.size()); !s.ok()) return s;
    values->Reserve(flags.size());
    for (bool flag : flags) values->AddAlreadyReserved(flag ? 1.0f : 0.0f);
  } else {
    const auto& flags = data.tensor->contents().uint_contents();
    if (auto s = CheckTypedCount(data, "uint_contents", flags.size()); !s.ok()) return s;
    values->Reserve(flags.size());
    for (uint32_t flag : flags) values->AddAlreadyReserved(flag != 0 ? 1.0f : 0.0f);
  }
  out->mutable_shape()->CopyFrom(data.tensor->shape());
  return absl::OkStatus();
}

absl::Status ToAttendTensor(const TensorData& data, v1::AttendRequest* attend) {
  const std::string& name = data.tensor->name();
  if (name == "input") return ToFloatTensor(data, attend->mutable_input());
  if (name == "memory") return ToFloatTensor(data, attend->mutable_memory());
  if (name == "lengths") return ToLengths(data, attend->mutable_lengths());
  if (name == "memory_lengths") return ToLengths(data, attend->mutable_memory_lengths());
  return ToMask(data, attend->mutable_attn_mask());
}

absl::Status ToAttendInputs(inference::ModelInferRequest* request, v1::AttendRequest* attend) {
  const bool raw = request->raw_input_contents_size() > 0;
  if (raw && request->raw_input_contents_size() != request->inputs_size()) {
    return Invalid("raw_input_contents: expected ", request->inputs_size(),
                   " entries (one per input) or none, got ", request->raw_input_contents_size());
  }
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < request->inputs_size(); ++i) {
    InputTensor* tensor = request->mutable_inputs(i);
    bool known = false;
    for (const TensorKind& kind : kInputKinds) known = known || tensor->name() == kind.name;
    if (!known) {
      return Invalid("inputs[", i, "].name: expected one of input, memory, lengths, ",
                     "memory_lengths, attn_mask, got \"", EchoForMessage(tensor->name()), "\"");
    }
    if (!seen.insert(tensor->name()).second) {
      return Invalid("inputs[", i, "].name: expected each input once, got \"",
                     EchoForMessage(tensor->name()), "\" again");
    }
    if (raw && tensor->has_contents() && tensor->contents().ByteSizeLong() > 0) {
      return Invalid(TensorName(tensor->name()),
                     ": expected its data in raw_input_contents or contents, got both");
    }
    absl::StatusOr<int64_t> count = ElementCount(*tensor);
    if (!count.ok()) return count.status();
    const TensorData data{tensor, raw ? request->mutable_raw_input_contents(i) : nullptr, *count};
    if (auto s = ToAttendTensor(data, attend); !s.ok()) return s;
  }
  if (!seen.contains("input")) {
    return Invalid("inputs: expected a tensor named \"input\" (FP32 [B, T, d_model] or ",
                   "[T, d_model]), got none");
  }
  return absl::OkStatus();
}

absl::Status ExpectParameterType(const std::string& name, const inference::InferParameter& value,
                                 inference::InferParameter::ParameterChoiceCase expected,
                                 absl::string_view expected_name) {
  if (value.parameter_choice_case() == expected) return absl::OkStatus();
  static constexpr absl::string_view kNames[] = {"none",         "bool_param",   "int64_param",
                                                 "string_param", "double_param", "uint64_param"};
  const int got = static_cast<int>(value.parameter_choice_case());
  return Invalid(ParameterName(name), ": expected ", expected_name, ", got ",
                 got >= 0 && got < 6 ? kNames[got] : "an unknown type");
}

// "1,0,1,1" (or "1011"): one flag per head.
absl::Status ToHeadMask(const std::string& text, v1::AttendRequest* attend) {
  for (char c : text) {
    if (c == '0' || c == '1') {
      attend->add_head_mask(c == '1');
    } else if (c != ',' && c != ' ') {
      return Invalid(ParameterName("head_mask"),
                     ": expected one 0 or 1 per head (e.g. \"1,0,1,1\"), got \"",
                     EchoForMessage(text), "\"");
    }
  }
  return absl::OkStatus();
}

absl::Status ToAttendParameters(const inference::ModelInferRequest& request,
                                v1::AttendRequest* attend) {
  using Choice = inference::InferParameter::ParameterChoiceCase;
  for (const auto& [name, value] : request.parameters()) {
    if (name == "causal") {
      if (auto s = ExpectParameterType(name, value, Choice::kBoolParam, "bool_param"); !s.ok()) {
        return s;
      }
      attend->set_mask(value.bool_param() ? v1::MASK_CAUSAL : v1::MASK_NONE);
    } else if (name == "return_weights") {
      if (auto s = ExpectParameterType(name, value, Choice::kBoolParam, "bool_param"); !s.ok()) {
        return s;
      }
      attend->set_return_weights(value.bool_param());
    } else if (name == "head_mask") {
      if (auto s = ExpectParameterType(name, value, Choice::kStringParam, "string_param");
          !s.ok()) {
        return s;
      }
      if (auto s = ToHeadMask(value.string_param(), attend); !s.ok()) return s;
    } else {
      return Invalid(ParameterName(name),
                     ": expected one of causal, head_mask, return_weights, got an unknown "
                     "parameter");
    }
  }
  return absl::OkStatus();
}

// Requested outputs decide the answer; listing `weights` asks for them as return_weights does.
absl::Status ToAnswer(const inference::ModelInferRequest& request, v1::AttendRequest* attend,
                      InferAnswer* answer) {
  answer->raw = request.raw_input_contents_size() > 0;
  if (request.outputs().empty()) {
    answer->output = true;
    answer->weights = attend->return_weights();
    return absl::OkStatus();
  }
  answer->output = false;
  answer->weights = false;
  for (int i = 0; i < request.outputs_size(); ++i) {
    const std::string& name = request.outputs(i).name();
    bool* wanted = name == "output"    ? &answer->output
                   : name == "weights" ? &answer->weights
                                       : nullptr;
    if (wanted == nullptr) {
      return Invalid("outputs[", i, "].name: expected output or weights, got \"",
                     EchoForMessage(name), "\"");
    }
    if (*wanted) {
      return Invalid("outputs[", i, "].name: expected each output once, got \"", name, "\" again");
    }
    *wanted = true;
  }
  attend->set_return_weights(answer->weights);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttendWork> ParseModelInferRequest(inference::ModelInferRequest* request,
                                                  std::shared_ptr<const model::Model> model,
                                                  const ModelLimits& limits, InferAnswer* answer) {
  if (model == nullptr) return Internal("ParseModelInferRequest: no model");
  if (!request->model_version().empty() &&
      request->model_version() != absl::StrCat(model->version)) {
    return absl::NotFoundError(absl::StrCat(
        "model_version: expected \"", model->version, "\" (the serving version of model \"",
        model->name, "\") or \"\", got \"", EchoForMessage(request->model_version()), "\""));
  }
  v1::AttendRequest attend;
  attend.set_request_id(request->id());
  attend.set_raw_output(true);  // Moved into the answer's raw bytes or copied into its contents.
  if (auto s = ToAttendParameters(*request, &attend); !s.ok()) return s;
  if (auto s = ToAnswer(*request, &attend, answer); !s.ok()) return s;
  if (auto s = ToAttendInputs(request, &attend); !s.ok()) return s;
  return ParseAttendRequest(attend, std::move(model), limits);
}

}  // namespace attnserve::server::oip
