#include "client/src/infer_conversion.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/checked_math.h"

namespace attnserve::client::internal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "raw tensors are little-endian float32: this library copies them as they are");

// product(shape) * element_bytes, or nullopt for a negative dimension or a product past int64_t.
// Checked at every step: a shape comes from the other side (a hostile answer's can be anything),
// and a wrapped product could match the bytes received and then size an allocation that throws.
std::optional<int64_t> CheckedSize(std::span<const int64_t> shape, int64_t element_bytes) {
  if (std::any_of(shape.begin(), shape.end(), [](int64_t dim) { return dim < 0; })) {
    return std::nullopt;
  }
  const std::optional<int64_t> elements = CheckedProduct(shape);
  if (!elements) return std::nullopt;
  return CheckedProduct({*elements, element_bytes});
}

// "[2, 3]" for a message.
std::string ShapeText(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
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
  const std::optional<int64_t> count = CheckedSize(input.shape, 1);
  if (!count || static_cast<uint64_t>(*count) != input.data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input: the shape ", ShapeText(input.shape), " holds ",
                     count ? absl::StrCat(*count) : "no valid count of",
                     " elements but the data has ", input.data.size()));
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
  // Nothing is allocated before the shape, checked without overflow, matches what arrived: the
  // allocation is bounded by the message received, and no shape can make it throw (an exception
  // on InferAsync's gRPC thread would be fatal).
  const std::span<const int64_t> shape = result.output.shape;
  if (index < response.raw_output_contents_size()) {
    const std::string& raw = response.raw_output_contents(index);
    const std::optional<int64_t> bytes = CheckedSize(shape, sizeof(float));
    if (!bytes || static_cast<uint64_t>(*bytes) != raw.size()) {
      return absl::InternalError(absl::StrCat("answer's output: ", raw.size(),
                                              " raw bytes for shape ", ShapeText(shape), " (",
                                              bytes ? absl::StrCat(*bytes, " bytes of FP32")
                                                    : "a negative dimension or past 2^63 bytes",
                                              ")"));
    }
    result.output.data.resize(raw.size() / sizeof(float));
    if (!raw.empty()) std::memcpy(result.output.data.data(), raw.data(), raw.size());
  } else {
    const auto& values = tensor.contents().fp32_contents();
    const std::optional<int64_t> count = CheckedSize(shape, 1);
    if (!count || static_cast<uint64_t>(*count) != static_cast<uint64_t>(values.size())) {
      return absl::InternalError(absl::StrCat(
          "answer's output: ", values.size(), " values for shape ", ShapeText(shape), " (",
          count ? absl::StrCat(*count, " elements") : "a negative dimension or past 2^63 elements",
          ")"));
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
