#include "client/src/conversion.h"

#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve::client::internal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "raw tensors are little-endian float32: this library copies them as they are");

// product(shape), or -1 for a negative dimension or an overflow.
int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || (dim > 0 && count > std::numeric_limits<int64_t>::max() / dim)) return -1;
    count *= dim;
  }
  return count;
}

absl::Status FillTensor(const char* field, TensorView view, bool raw, v1::Tensor* tensor) {
  const int64_t count = Elements(view.shape);
  if (count < 0 || static_cast<size_t>(count) != view.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": the shape holds ", count, " elements but the data has ", view.data.size()));
  }
  tensor->mutable_shape()->Add(view.shape.begin(), view.shape.end());
  if (raw) {
    tensor->mutable_raw()->assign(reinterpret_cast<const char*>(view.data.data()),
                                  view.data.size_bytes());
  } else {
    tensor->mutable_values()->Add(view.data.begin(), view.data.end());
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ReadTensor(const char* field, const v1::Tensor& tensor) {
  Tensor out;
  out.shape.assign(tensor.shape().begin(), tensor.shape().end());
  const int64_t count = Elements(out.shape);
  if (!tensor.raw().empty()) {
    if (count < 0 || tensor.raw().size() != static_cast<size_t>(count) * sizeof(float)) {
      return absl::InternalError(absl::StrCat("answer's ", field, ": ", tensor.raw().size(),
                                              " raw bytes for ", count, " elements"));
    }
    out.data.resize(static_cast<size_t>(count));
    std::memcpy(out.data.data(), tensor.raw().data(), tensor.raw().size());
  } else {
    if (count < 0 || tensor.values_size() != count) {
      return absl::InternalError(absl::StrCat("answer's ", field, ": ", tensor.values_size(),
                                              " values for ", count, " elements"));
    }
    out.data.assign(tensor.values().begin(), tensor.values().end());
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::AttendRequest> MakeAttendRequest(std::string_view model, TensorView input,
                                                    const AttendOptions& options) {
  v1::AttendRequest request;
  request.set_model(std::string(model));
  if (absl::Status status = FillTensor("input", input, options.raw, request.mutable_input());
      !status.ok()) {
    return status;
  }
  if (options.memory) {
    if (absl::Status status =
            FillTensor("memory", *options.memory, options.raw, request.mutable_memory());
        !status.ok()) {
      return status;
    }
  }
  if (options.attn_mask) {
    if (absl::Status status =
            FillTensor("attn_mask", *options.attn_mask, options.raw, request.mutable_attn_mask());
        !status.ok()) {
      return status;
    }
  }
  request.mutable_lengths()->Add(options.lengths.begin(), options.lengths.end());
  request.mutable_memory_lengths()->Add(options.memory_lengths.begin(),
                                        options.memory_lengths.end());
  request.set_mask(options.mask == Mask::kCausal ? v1::MASK_CAUSAL : v1::MASK_NONE);
  for (bool head : options.head_mask) request.add_head_mask(head);
  request.set_return_weights(options.return_weights);
  request.set_raw_output(options.raw);
  request.set_request_id(options.request_id);
  return request;
}

absl::StatusOr<AttendResult> ReadAttendResponse(const v1::AttendResponse& response) {
  AttendResult result;
  absl::StatusOr<Tensor> output = ReadTensor("output", response.output());
  if (!output.ok()) return output.status();
  result.output = *std::move(output);
  if (response.has_weights()) {
    absl::StatusOr<Tensor> weights = ReadTensor("weights", response.weights());
    if (!weights.ok()) return weights.status();
    result.weights = *std::move(weights);
  }
  result.model = response.model();
  result.model_version = response.model_version();
  result.request_id = response.request_id();
  result.timing = {.queue_us = response.timing().queue_us(),
                   .compute_us = response.timing().compute_us(),
                   .batch_sequences = response.timing().batch_sequences(),
                   .batch_tokens = response.timing().batch_tokens()};
  return result;
}

ModelInfo ReadModelInfo(const v1::ModelInfo& info) {
  return {.name = info.name(),
          .d_model = info.d_model(),
          .num_heads = info.num_heads(),
          .variant = info.variant(),
          .bias = info.bias(),
          .dtype = info.dtype(),
          .parameter_count = info.parameter_count(),
          .batching = {.max_batch_sequences = info.batching().max_batch_sequences(),
                       .max_batch_tokens = info.batching().max_batch_tokens(),
                       .max_queue_delay_us = info.batching().max_queue_delay_us(),
                       .max_queue_size = info.batching().max_queue_size(),
                       .max_queued_bytes = info.batching().max_queued_bytes()},
          .max_sequence_length = info.max_sequence_length(),
          .version = info.version(),
          .source = info.source(),
          .is_default = info.is_default()};
}

}  // namespace attnserve::client::internal
