#include "server/batching/batching_options.h"

#include "absl/strings/str_cat.h"

namespace attnserve::batching {
namespace {

absl::Status CheckAtLeast(const char* field, int64_t minimum, int64_t value) {
  if (value >= minimum) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("BatchingOptions.", field, ": expected >= ", minimum, ", got ", value));
}

}  // namespace

absl::Status ValidateBatchingOptions(const BatchingOptions& options) {
  for (absl::Status status : {
           CheckAtLeast("max_batch_sequences", 1, options.max_batch_sequences),
           CheckAtLeast("max_batch_tokens", 1, options.max_batch_tokens),
           CheckAtLeast("max_queue_delay_us", 0, options.max_queue_delay_us),
           CheckAtLeast("max_queue_size", 1, options.max_queue_size),
           CheckAtLeast("max_queued_bytes", 0, options.max_queued_bytes),
       }) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace attnserve::batching
