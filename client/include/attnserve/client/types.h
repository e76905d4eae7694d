// Value types of the attnserve client library: tensors, per-call options, results, model
// descriptions. No protobuf or gRPC types appear here.
#ifndef ATTNSERVE_CLIENT_TYPES_H_
#define ATTNSERVE_CLIENT_TYPES_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace attnserve::client {

// A borrowed dense row-major float32 tensor: `data` holds product(shape) elements and must stay
// valid while the call that takes the view runs (it is copied into the request).
struct TensorView {
  std::span<const float> data = {};
  std::vector<int64_t> shape = {};
};

// An owned dense row-major float32 tensor.
struct Tensor {
  std::vector<float> data = {};
  std::vector<int64_t> shape = {};

  TensorView view() const { return {data, shape}; }
};

enum class Mask { kNone, kCausal };

// Everything about one Attend call besides the model and the input. Defaults: self-attention, no
// mask, no weights, the client's default deadline, raw float32 bytes on the wire.
struct AttendOptions {
  // Cross-attention: keys and values come from `memory` ([S, d_model] or [B, S, d_model]).
  std::optional<TensorView> memory = {};
  // Valid length of each of the B sequences of a rank-3 input (and memory); empty = all full.
  std::vector<int32_t> lengths = {};
  std::vector<int32_t> memory_lengths = {};
  Mask mask = Mask::kNone;
  // Optional explicit mask [T, S] or [B, T, S]: 0 = blocked, anything else = allowed.
  std::optional<TensorView> attn_mask = {};
  // Optional, one per head: false disables the head.
  std::vector<bool> head_mask = {};
  bool return_weights = false;
  // Echoed back in the result; the streaming session fills in a unique one when empty.
  std::string request_id = {};
  // 0 = ClientOptions::default_deadline.
  std::chrono::milliseconds deadline{0};
  // Send and receive raw little-endian float32 bytes (fast) instead of repeated floats.
  bool raw = true;
};

// The server's account of how the request was computed.
struct Timing {
  int64_t queue_us = 0;         // Enqueue to batch start.
  int64_t compute_us = 0;       // The batch's compute time.
  int32_t batch_sequences = 0;  // Sequences in that batch (all requests).
  int32_t batch_tokens = 0;     // Query rows in that batch.
};

struct AttendResult {
  Tensor output = {};                  // The input's shape.
  std::optional<Tensor> weights = {};  // [h, T, S] or [B, h, T, S] when return_weights.
  std::string model = {};              // The model that answered.
  int64_t model_version = 0;
  std::string request_id = {};
  Timing timing = {};
  std::chrono::microseconds latency{0};  // Client side: call start to answer, retries included.
};

struct BatchingLimits {
  int64_t max_batch_sequences = 0;
  int64_t max_batch_tokens = 0;
  int64_t max_queue_delay_us = 0;
  int64_t max_queue_size = 0;
  int64_t max_queued_bytes = 0;  // 0 = no per-model limit.
};

struct ModelInfo {
  std::string name = {};
  int32_t d_model = 0;
  int32_t num_heads = 0;
  std::string variant = {};  // "multi_head" or "single_head".
  bool bias = false;
  std::string dtype = {};
  int64_t parameter_count = 0;
  BatchingLimits batching = {};
  int64_t max_sequence_length = 0;
  int64_t version = 0;
  std::string source = {};
  bool is_default = false;
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_TYPES_H_
