#include "client/src/conversion.h"

#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/float_format.h"

namespace attnserve::client::internal {
namespace {

// product(shape), or -1 for a negative dimension or an overflow.
int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || (dim > 0 && count > std::numeric_limits<int64_t>::max() / dim)) return -1;
    count *= dim;
  }
  return count;
}

// WireDtype, FloatFormat (core/util/float_format.h) and v1::DataType number their types alike.
static_assert(static_cast<int>(WireDtype::kBFloat16) == v1::DATA_TYPE_BF16 &&
              static_cast<int>(WireDtype::kFloat16) == v1::DATA_TYPE_FP16 &&
              static_cast<int>(FloatFormat::kBFloat16) == v1::DATA_TYPE_BF16 &&
              static_cast<int>(FloatFormat::kFloat16) == v1::DATA_TYPE_FP16 &&
              v1::DataType_MAX == v1::DATA_TYPE_FP16);

FloatFormat FormatOf(WireDtype dtype) { return static_cast<FloatFormat>(dtype); }

absl::Status FillTensor(const char* field, TensorView view, bool raw, FloatFormat format,
                        v1::Tensor* tensor) {
  const int64_t count = Elements(view.shape);
  if (count < 0 || static_cast<size_t>(count) != view.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": the shape holds ", count, " elements but the data has ", view.data.size()));
  }
  tensor->mutable_shape()->Add(view.shape.begin(), view.shape.end());
  if (raw) {
    tensor->set_dtype(static_cast<v1::DataType>(format));
    std::string* bytes = tensor->mutable_raw();
    if (format == FloatFormat::kFloat32) {
      // One pass: resize would first zero every byte that the copy then overwrites.
      bytes->assign(reinterpret_cast<const char*>(view.data.data()), view.data.size_bytes());
    } else {
      bytes->resize(view.data.size() * static_cast<size_t>(FloatFormatBytes(format)));
      EncodeFloats(view.data, format, bytes->data());
    }
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
    const std::optional<FloatFormat> known = FloatFormatNumbered(tensor.dtype());
    if (!known) {
      return absl::InternalError(
          absl::StrCat("answer's ", field, ": unknown dtype ", static_cast<int>(tensor.dtype())));
    }
    const FloatFormat format = *known;
    const int64_t element_bytes = FloatFormatBytes(format);
    if (count < 0 || count > std::numeric_limits<int64_t>::max() / element_bytes ||
        tensor.raw().size() != static_cast<size_t>(count * element_bytes)) {
      return absl::InternalError(absl::StrCat("answer's ", field, ": ", tensor.raw().size(),
                                              " raw bytes for ", count, " ",
                                              v1::DataType_Name(tensor.dtype()), " elements"));
    }
    out.data.resize(static_cast<size_t>(count));
    DecodeFloats(tensor.raw().data(), count, format, out.data.data());
  } else {
    if (count < 0 || tensor.values_size() != count) {
      return absl::InternalError(absl::StrCat("answer's ", field, ": ", tensor.values_size(),
                                              " values for ", count, " elements"));
    }
    out.data.assign(tensor.values().begin(), tensor.values().end());
  }
  return out;
}

// An item's or message's error as the server sent it (absl::StatusCode numbers are gRPC's). A
// code of 0 would read as OK: it becomes Unknown, so an error is never mistaken for success.
absl::Status StatusOf(const v1::ErrorStatus& error) {
  if (error.code() == 0) return absl::UnknownError(error.message());
  return absl::Status(static_cast<absl::StatusCode>(error.code()), error.message());
}

// Only raw bytes carry a dtype: a request or answer dtype other than fp32 needs raw = true.
absl::Status CheckDtypesNeedRaw(FloatFormat format, FloatFormat answer_format, bool raw) {
  if (raw || (format == FloatFormat::kFloat32 && answer_format == FloatFormat::kFloat32)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      format != FloatFormat::kFloat32 ? "wire_dtype" : "answer_wire_dtype", ": ",
      std::string(FloatFormatName(format != FloatFormat::kFloat32 ? format : answer_format)),
      " needs raw = true (only raw bytes carry a dtype)"));
}

}  // namespace

absl::StatusOr<v1::AttendRequest> MakeAttendRequest(std::string_view model, TensorView input,
                                                    const AttendOptions& options) {
  const FloatFormat format = FormatOf(options.wire_dtype);
  const FloatFormat answer_format = FormatOf(options.answer_wire_dtype);
  if (absl::Status status = CheckDtypesNeedRaw(format, answer_format, options.raw); !status.ok()) {
    return status;
  }
  v1::AttendRequest request;
  request.set_model(std::string(model));
  if (absl::Status status =
          FillTensor("input", input, options.raw, format, request.mutable_input());
      !status.ok()) {
    return status;
  }
  if (options.memory) {
    if (absl::Status status =
            FillTensor("memory", *options.memory, options.raw, format, request.mutable_memory());
        !status.ok()) {
      return status;
    }
  }
  if (options.attn_mask) {
    // A mask, not data: always float32 (each tensor carries its own dtype), so that no value
    // changes meaning on a 16-bit wire (f16 makes 1e-8, allowed, a blocking 0 and 1e6 an inf the
    // server refuses). The server reads only zero / non-zero and finiteness.
    if (absl::Status status = FillTensor("attn_mask", *options.attn_mask, options.raw,
                                         FloatFormat::kFloat32, request.mutable_attn_mask());
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
  request.set_raw_output_dtype(static_cast<v1::DataType>(answer_format));
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
  result.response_bytes = static_cast<int64_t>(response.ByteSizeLong());
  result.model = response.model();
  result.model_version = response.model_version();
  result.request_id = response.request_id();
  result.timing = {.queue_us = response.timing().queue_us(),
                   .compute_us = response.timing().compute_us(),
                   .batch_sequences = response.timing().batch_sequences(),
                   .batch_tokens = response.timing().batch_tokens()};
  return result;
}

absl::StatusOr<v1::DecodeRequest> MakeDecodeRequest(const DecodeMessage& message,
                                                    const DecodeStreamOptions& options,
                                                    const std::string& request_id) {
  const FloatFormat format = FormatOf(options.wire_dtype);
  const FloatFormat answer_format = FormatOf(options.answer_wire_dtype);
  if (absl::Status status = CheckDtypesNeedRaw(format, answer_format, options.raw); !status.ok()) {
    return status;
  }
  v1::DecodeRequest request;
  request.set_request_id(request_id);
  for (size_t i = 0; i < message.opens.size(); ++i) {
    const DecodeOpen& open = message.opens[i];
    v1::DecodeOpen* item = request.add_opens();
    item->set_session(open.session);
    item->set_model(open.model);
    item->set_expected_version(open.expected_version);
    if (open.memory) {
      const std::string field = absl::StrCat("opens[", i, "].memory");
      if (absl::Status status =
              FillTensor(field.c_str(), *open.memory, options.raw, format, item->mutable_memory());
          !status.ok()) {
        return status;
      }
    }
  }
  for (size_t i = 0; i < message.steps.size(); ++i) {
    const DecodeStep& step = message.steps[i];
    v1::DecodeStep* item = request.add_steps();
    item->set_session(step.session);
    const std::string field = absl::StrCat("steps[", i, "].rows");
    if (absl::Status status =
            FillTensor(field.c_str(), step.rows, options.raw, format, item->mutable_rows());
        !status.ok()) {
      return status;
    }
    item->set_raw_output(options.raw);
    item->set_raw_output_dtype(static_cast<v1::DataType>(answer_format));
  }
  for (const std::string& session : message.closes) request.add_closes()->set_session(session);
  return request;
}

absl::StatusOr<DecodeAnswer> ReadDecodeResponse(const v1::DecodeRequest& request,
                                                const v1::DecodeResponse& response) {
  if (response.has_error()) return StatusOf(response.error());
  if (response.opens_size() != request.opens_size() ||
      response.steps_size() != request.steps_size() ||
      response.closes_size() != request.closes_size()) {
    return absl::InternalError(absl::StrCat(
        "Decode answer ", response.request_id(), ": ", response.opens_size(), " opens, ",
        response.steps_size(), " steps, ", response.closes_size(), " closes for a message of ",
        request.opens_size(), ", ", request.steps_size(), " and ", request.closes_size()));
  }
  DecodeAnswer answer;
  for (const v1::DecodeOpenResult& open : response.opens()) {
    if (open.has_error()) {
      answer.opens.emplace_back(StatusOf(open.error()));
    } else {
      answer.opens.emplace_back(DecodeOpened{
          .session = open.session(), .model = open.model(), .model_version = open.model_version()});
    }
  }
  for (const v1::DecodeStepResult& step : response.steps()) {
    if (step.has_error()) {
      answer.steps.emplace_back(StatusOf(step.error()));
    } else {
      answer.steps.emplace_back(ReadTensor("steps.output", step.output()));
    }
  }
  for (const v1::DecodeCloseResult& close : response.closes()) {
    answer.closes.push_back(close.has_error() ? StatusOf(close.error()) : absl::OkStatus());
  }
  answer.response_bytes = static_cast<int64_t>(response.ByteSizeLong());
  return answer;
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
          .is_default = info.is_default(),
          .server_version = info.server_version(),
          .kv_cache_dtype = info.kv_cache_dtype()};
}

}  // namespace attnserve::client::internal
