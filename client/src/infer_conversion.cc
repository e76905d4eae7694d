#include "client/src/infer_conversion.h"

#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve::client::internal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "raw tensors are little-endian float32: this library copies them as they are");

// product(shape), or -1 for a negative dimension or an overflow.
template <typename Dims>
int64_t Elements(const Dims& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || (dim > 0 && count > std::numeric_limits<int64_t>::max() / dim)) return -1;
    count *= dim;
  }
  return count;
}

std::optional<int64_t> Int64Parameter(const inference::ModelInferResponse& response,
                                      const std::string& name) {
  const auto found = response.parameters().find(name);
  if (found == response.parameters().end() ||
      found->second.parameter_choice_case() != inference::InferParameter::kInt64Param) {
    return std::nullopt;
  }
  return found->second.int64_param();
}

}  // namespace

absl::StatusOr<inference::ModelInferRequest> MakeModelInferRequest(std::string_view model,
                                                                   TensorView input,
                                                                   const InferOptions& options) {
  const int64_t count = Elements(input.shape);
  if (count < 0 || static_cast<size_t>(count) != input.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input: the shape holds ", count, " elements but the data has ", input.data.size()));
  }
  inference::ModelInferRequest request;
  request.set_model_name(std::string(model));
  request.set_id(options.id);
  auto* tensor = request.add_inputs();
  tensor->set_name("input");
  tensor->set_datatype("FP32");
  tensor->mutable_shape()->Add(input.shape.begin(), input.shape.end());
  request.add_raw_input_contents()->assign(reinterpret_cast<const char*>(input.data.data()),
                                           input.data.size_bytes());
  if (options.mask == Mask::kCausal) {
    (*request.mutable_parameters())["causal"].set_bool_param(true);
  }
  return request;
}

absl::StatusOr<InferResult> ReadModelInferResponse(const inference::ModelInferResponse& response) {
  int index = -1;
  for (int i = 0; i < response.outputs_size(); ++i) {
    if (response.outputs(i).name() == "output") index = i;
  }
  if (index < 0) return absl::InternalError("answer has no tensor named \"output\"");
  const auto& tensor = response.outputs(index);
  if (tensor.datatype() != "FP32") {
    return absl::InternalError(
        absl::StrCat("answer's output: datatype ", tensor.datatype(), ", expected FP32"));
  }
  InferResult result;
  result.output.shape.assign(tensor.shape().begin(), tensor.shape().end());
  const int64_t count = Elements(result.output.shape);
  if (index < response.raw_output_contents_size()) {
    const std::string& raw = response.raw_output_contents(index);
    if (count < 0 || raw.size() != static_cast<size_t>(count) * sizeof(float)) {
      return absl::InternalError(
          absl::StrCat("answer's output: ", raw.size(), " raw bytes for ", count, " elements"));
    }
    result.output.data.resize(static_cast<size_t>(count));
    std::memcpy(result.output.data.data(), raw.data(), raw.size());
  } else {
    const auto& values = tensor.contents().fp32_contents();
    if (count < 0 || values.size() != count) {
      return absl::InternalError(
          absl::StrCat("answer's output: ", values.size(), " values for ", count, " elements"));
    }
    result.output.data.assign(values.begin(), values.end());
  }
  result.model = response.model_name();
  result.model_version = response.model_version();
  result.id = response.id();
  result.timing = {.queue_us = Int64Parameter(response, "queue_us"),
                   .compute_us = Int64Parameter(response, "compute_us"),
                   .batch_sequences = Int64Parameter(response, "batch_sequences")};
  return result;
}

}  // namespace attnserve::client::internal
