// ModelLimits: every limit in force for one model — how its requests are batched and what one
// request may ask — produced once per model version (the server's defaults with the model's
// config.json overrides applied) and read as is by the batcher, request validation and ModelInfo.
//
// Plain value types; copy freely. Thread-safe as any const value.
#ifndef ATTNSERVE_SERVER_RUNTIME_MODEL_LIMITS_H_
#define ATTNSERVE_SERVER_RUNTIME_MODEL_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/model/model_config.h"
#include "server/batching/batching_options.h"

namespace attnserve::server {

// Protobuf's hard limit on one serialised message.
inline constexpr int64_t kMaxMessageBytes = (int64_t{1} << 31) - 1;

// What one request may ask of a model, besides the batching limits (a request may hold at most
// max_batch_sequences sequences and max_batch_tokens query rows, since it must fit one batch).
struct RequestLimits {
  // Longest query or memory sequence: the padded T and S of a request. >= 1.
  int64_t max_sequence_length = 4096;
  // Largest estimated response in bytes: the padded output plus, with return_weights, the padded
  // weights (B·h·T·S floats). The server sets it to its gRPC send limit; capped at
  // kMaxMessageBytes whatever is set here, since protobuf cannot serialise a larger message.
  int64_t max_response_bytes = int64_t{64} << 20;
};

struct ModelLimits {
  batching::BatchingOptions batching;
  RequestLimits request;
};

// `defaults` with every value `config` sets (max_sequence_length, batching.*) in its place.
ModelLimits ApplyModelConfig(const ModelLimits& defaults, const model::ModelConfig& config);

// OK, or InvalidArgument naming the first bad field (ValidateBatchingOptions, then
// max_sequence_length >= 1 and max_response_bytes >= 1), what it expects and what it got.
absl::Status ValidateModelLimits(const ModelLimits& limits);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_MODEL_LIMITS_H_
