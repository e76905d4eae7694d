// conversion.h, response side: results, model descriptions and statuses → protobuf.
#include <algorithm>
#include <bit>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/version.h"
#include "core/forward/attention_config.h"
#include "core/util/checked_math.h"
#include "core/util/float_format.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/conversion/attnserve_v1/conversion_internal.h"
#include "server/conversion/grpc_status.h"

namespace attnserve::server {
namespace {

using ::attnserve::CheckedProduct;
using conversion_internal::AnswerFormat;
using conversion_internal::CheckResultShape;
using conversion_internal::Internal;
using conversion_internal::kFloatBytes;
using conversion_internal::Unpadded;

// Bytes for `count` zeroed elements in `tensor`: raw (with its dtype set) or values.
char* AllocateFloats(v1::Tensor* tensor, int64_t count, const AttendWork& work) {
  if (work.raw_output) {
    tensor->set_dtype(conversion_internal::DataTypeOf(work.raw_output_format));
    std::string* bytes = tensor->mutable_raw();
    bytes->assign(static_cast<size_t>(count * FloatFormatBytes(work.raw_output_format)), '\0');
    return bytes->data();
  }
  google::protobuf::RepeatedField<float>* values = tensor->mutable_values();
  values->Resize(static_cast<int>(count), 0.0f);
  return reinterpret_cast<char*>(values->mutable_data());
}

void FillOutput(const AttendWork& work, const AttendResult& result, v1::Tensor* tensor) {
  tensor->Clear();
  const std::vector<int64_t> shape = conversion_internal::OutputShape(work);
  tensor->mutable_shape()->Add(shape.begin(), shape.end());
  if (Unpadded(work)) {
    conversion_internal::AssignFloats(result.output, work.raw_output, work.raw_output_format,
                                      tensor);
    return;
  }
  char* destination = AllocateFloats(tensor, conversion_internal::ElementCount(shape), work);
  conversion_internal::WritePaddedOutput(work, result, destination);
}

void FillWeights(const AttendWork& work, const AttendResult& result, v1::Tensor* tensor) {
  tensor->Clear();
  const std::vector<int64_t> shape = conversion_internal::WeightsShape(work);
  tensor->mutable_shape()->Add(shape.begin(), shape.end());
  if (Unpadded(work)) {
    conversion_internal::AssignFloats(result.weights, work.raw_output, work.raw_output_format,
                                      tensor);
    return;
  }
  char* destination = AllocateFloats(tensor, conversion_internal::ElementCount(shape), work);
  conversion_internal::WritePaddedWeights(work, result, destination);
}

int32_t SaturatedInt32(int64_t value) {
  return static_cast<int32_t>(std::clamp<int64_t>(value, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

}  // namespace

absl::Status FillAttendResponse(const AttendWork& work, const AttendResult& result,
                                v1::AttendResponse* response) {
  if (auto s = CheckResultShape(work, result); !s.ok()) return s;
  FillOutput(work, result, response->mutable_output());
  if (work.return_weights) {
    FillWeights(work, result, response->mutable_weights());
  } else {
    response->clear_weights();
  }
  conversion_internal::FillAnswerFields(work, result, response);
  return absl::OkStatus();
}

void FillModelInfo(const model::Model& model, const ModelLimits& limits, bool is_default,
                   v1::ModelInfo* info) {
  const core::AttentionConfig& config = model.config.attention;
  info->Clear();
  info->set_name(model.name);
  info->set_d_model(SaturatedInt32(config.d_model));
  info->set_num_heads(SaturatedInt32(config.num_heads));
  info->set_variant(std::string(core::VariantName(config.variant)));
  info->set_bias(config.bias);
  info->set_dtype(std::string(core::ComputeTypeName(config.compute_type)));
  info->set_parameter_count(config.ParameterCount());
  v1::BatchingLimits* batching = info->mutable_batching();
  batching->set_max_batch_sequences(limits.batching.max_batch_sequences);
  batching->set_max_batch_tokens(limits.batching.max_batch_tokens);
  batching->set_max_queue_delay_us(limits.batching.max_queue_delay_us);
  batching->set_max_queue_size(limits.batching.max_queue_size);
  batching->set_max_queued_bytes(limits.batching.max_queued_bytes);
  info->set_max_sequence_length(limits.request.max_sequence_length);
  info->set_version(model.version);
  info->set_source(model.source);
  info->set_is_default(is_default);
  info->set_server_version(kVersion);
  info->set_kv_cache_dtype(std::string(model::KvCacheStorageName(model.config)));
}

void FillDecodeSessions(const SessionsPerVersion& sessions, v1::ModelInfo* info) {
  info->set_decode_sessions(0);
  info->clear_retired_versions();
  // The map is ordered by (name, version): this model's versions are adjacent, oldest first.
  for (auto it = sessions.lower_bound({info->name(), std::numeric_limits<int64_t>::min()});
       it != sessions.end() && it->first.first == info->name(); ++it) {
    const auto& [key, count] = *it;
    if (key.second == info->version()) {
      info->set_decode_sessions(count);
    } else if (count > 0) {
      v1::RetiredVersion* retired = info->add_retired_versions();
      retired->set_version(key.second);
      retired->set_decode_sessions(count);
    }
  }
}

void FillErrorResponse(std::string_view model, std::string_view request_id,
                       const absl::Status& status, v1::AttendResponse* response) {
  response->Clear();
  response->set_model(std::string(model));
  response->set_request_id(std::string(request_id));
  conversion_internal::FillErrorStatus(status, response->mutable_error());
}

namespace conversion_internal {

using ::attnserve::CheckedProduct;

// The encoding of the answer's tensors: raw_output_format in raw, float32 in values.
FloatFormat AnswerFormat(const AttendWork& work) {
  return work.raw_output ? work.raw_output_format : FloatFormat::kFloat32;
}

// OK when `work`'s shape is self-consistent and `result` has the sizes it implies, so that
// FillAttendResponse's copies stay in bounds. Padded sizes are checked first: once they fit, no
// product below can overflow.
absl::Status CheckResultShape(const AttendWork& work, const AttendResult& result) {
  if (work.model == nullptr) return Internal("work.model: expected a model, got null");
  const core::AttentionConfig& config = work.model->config.attention;
  const int64_t batch = work.sequences();
  const auto output =
      CheckedProduct({batch, work.padded_query_length, config.d_model, kFloatBytes});
  const auto weights = CheckedProduct(
      {batch, config.num_heads, work.padded_query_length, work.padded_memory_length, kFloatBytes});
  if (!output || !weights || *output > kMaxMessageBytes ||
      (work.return_weights && *weights > kMaxMessageBytes - *output)) {
    return Internal("work: expected a padded response within ", kMaxMessageBytes,
                    " bytes (a protobuf message), got more");
  }
  const std::vector<int64_t>& keys =
      work.cross_attention ? work.memory_lengths : work.query_lengths;
  if (static_cast<int64_t>(keys.size()) != batch) {
    return Internal("work.memory_lengths: expected ", batch, " entries, got ", keys.size());
  }
  int64_t rows = 0;
  int64_t scores = 0;
  for (int64_t b = 0; b < batch; ++b) {
    if (work.query_lengths[b] < 1 || work.query_lengths[b] > work.padded_query_length ||
        keys[b] < 1 || keys[b] > work.padded_memory_length) {
      return Internal("work sequence ", b, ": expected lengths within the padded sizes ",
                      work.padded_query_length, " x ", work.padded_memory_length, ", got ",
                      work.query_lengths[b], " x ", keys[b]);
    }
    rows += work.query_lengths[b];
    scores += work.query_lengths[b] * keys[b];
  }
  if (static_cast<int64_t>(result.output.size()) != rows * config.d_model) {
    return Internal("result.output: expected ", rows * config.d_model, " floats, got ",
                    result.output.size());
  }
  const int64_t expected_weights = work.return_weights ? config.num_heads * scores : 0;
  if (static_cast<int64_t>(result.weights.size()) != expected_weights) {
    return Internal("result.weights: expected ", expected_weights, " floats, got ",
                    result.weights.size());
  }
  return absl::OkStatus();
}

// Whether no sequence of `work` is padded: the packed result is then the response as it is.
bool Unpadded(const AttendWork& work) {
  for (size_t b = 0; b < work.query_lengths.size(); ++b) {
    if (work.query_lengths[b] != work.padded_query_length) return false;
    if (work.cross_attention && work.memory_lengths[b] != work.padded_memory_length) return false;
  }
  return true;
}

void FillAnswerFields(const AttendWork& work, const AttendResult& result,
                      v1::AttendResponse* response) {
  response->set_model(work.model->name);
  response->set_model_version(work.model->version);
  response->set_request_id(work.request_id);
  v1::Timing* timing = response->mutable_timing();
  timing->set_queue_us(result.timing.queue_us);
  timing->set_compute_us(result.timing.compute_us);
  timing->set_batch_sequences(SaturatedInt32(result.timing.batch_sequences));
  timing->set_batch_tokens(SaturatedInt32(result.timing.batch_tokens));
}

std::vector<int64_t> OutputShape(const AttendWork& work) {
  std::vector<int64_t> shape;
  if (work.batched) shape.push_back(work.sequences());
  shape.push_back(work.padded_query_length);
  shape.push_back(work.model->config.attention.d_model);
  return shape;
}

std::vector<int64_t> WeightsShape(const AttendWork& work) {
  std::vector<int64_t> shape;
  if (work.batched) shape.push_back(work.sequences());
  shape.push_back(work.model->config.attention.num_heads);
  shape.push_back(work.padded_query_length);
  shape.push_back(work.padded_memory_length);
  return shape;
}

int64_t ElementCount(std::span<const int64_t> shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;  // Bounded by CheckResultShape.
  return count;
}

void WritePaddedOutput(const AttendWork& work, const AttendResult& result, char* destination) {
  const int64_t d = work.model->config.attention.d_model;
  const int64_t t_pad = work.padded_query_length;
  const FloatFormat format = AnswerFormat(work);
  const float* source = result.output.data();
  for (int64_t b = 0; b < work.sequences(); ++b) {
    const int64_t floats = work.query_lengths[b] * d;
    EncodeFloats({source, static_cast<size_t>(floats)}, format,
                 destination + b * t_pad * d * FloatFormatBytes(format));
    source += floats;
  }
}

void WritePaddedWeights(const AttendWork& work, const AttendResult& result, char* destination) {
  const int64_t heads = work.model->config.attention.num_heads;
  const int64_t t_pad = work.padded_query_length;
  const int64_t s_pad = work.padded_memory_length;
  const std::vector<int64_t>& keys =
      work.cross_attention ? work.memory_lengths : work.query_lengths;
  const FloatFormat format = AnswerFormat(work);
  const float* source = result.weights.data();
  for (int64_t b = 0; b < work.sequences(); ++b) {
    for (int64_t head = 0; head < heads; ++head) {
      for (int64_t t = 0; t < work.query_lengths[b]; ++t) {
        const int64_t row = ((b * heads + head) * t_pad + t) * s_pad;
        EncodeFloats({source, static_cast<size_t>(keys[b])}, format,
                     destination + row * FloatFormatBytes(format));
        source += keys[b];
      }
    }
  }
}

void AssignFloats(std::span<const float> source, bool raw_output, FloatFormat raw_format,
                  v1::Tensor* tensor) {
  if (!raw_output) {
    tensor->mutable_values()->Add(source.begin(), source.end());
  } else if (raw_format == FloatFormat::kFloat32) {
    tensor->mutable_raw()->assign(reinterpret_cast<const char*>(source.data()),
                                  source.size_bytes());
  } else {
    tensor->set_dtype(DataTypeOf(raw_format));
    std::string* bytes = tensor->mutable_raw();
    bytes->resize(source.size() * static_cast<size_t>(FloatFormatBytes(raw_format)));
    EncodeFloats(source, raw_format, bytes->data());
  }
}

void FillErrorStatus(const absl::Status& status, v1::ErrorStatus* error) {
  const grpc::Status grpc_status = ToGrpcStatus(status);
  error->set_code(static_cast<int32_t>(grpc_status.error_code()));
  error->set_message(grpc_status.error_message());
}

}  // namespace conversion_internal

}  // namespace attnserve::server
