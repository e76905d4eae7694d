#include "server/runtime/model_limits.h"

#include "absl/strings/str_cat.h"

namespace attnserve::server {

ModelLimits ApplyModelConfig(const ModelLimits& defaults, const model::ModelConfig& config) {
  ModelLimits limits = defaults;
  const model::BatchingOverrides& overrides = config.batching;
  batching::BatchingOptions& batching = limits.batching;
  batching.max_batch_sequences =
      overrides.max_batch_sequences.value_or(batching.max_batch_sequences);
  batching.max_batch_tokens = overrides.max_batch_tokens.value_or(batching.max_batch_tokens);
  batching.max_queue_delay_us = overrides.max_queue_delay_us.value_or(batching.max_queue_delay_us);
  batching.max_queue_size = overrides.max_queue_size.value_or(batching.max_queue_size);
  batching.max_queued_bytes = overrides.max_queued_bytes.value_or(batching.max_queued_bytes);
  limits.request.max_sequence_length =
      config.max_sequence_length.value_or(limits.request.max_sequence_length);
  return limits;
}

absl::Status ValidateModelLimits(const ModelLimits& limits) {
  if (absl::Status status = batching::ValidateBatchingOptions(limits.batching); !status.ok()) {
    return status;
  }
  if (limits.request.max_sequence_length < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequence_length: expected >= 1, got ",
                                                   limits.request.max_sequence_length));
  }
  if (limits.request.max_response_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_response_bytes: expected >= 1, got ", limits.request.max_response_bytes));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
