// Value types of the attnserve client library: tensors, per-call options, results, model
// descriptions. No protobuf or gRPC types appear here.
#ifndef ATTNSERVE_CLIENT_TYPES_H_
#define ATTNSERVE_CLIENT_TYPES_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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

// How float tensors travel as raw bytes (attnserve.v1 Tensor.dtype). The 16-bit types halve the
// bytes each way; the server computes in float32 whatever they are, and results always reach the
// caller as float32. Numbered as attnserve.v1's DataType.
enum class WireDtype {
  kFloat32 = 0,   // Exact (the default).
  kBFloat16 = 1,  // float32's range, 8 significant bits: rounding error <= 2^-8 of |x|.
  kFloat16 = 2,   // IEEE binary16, 11 significant bits (<= 2^-11 of |x|); finite only up to 65504.
};

// "fp32", "bf16" or "f16" (attnserve-cli's --wire-dtype spelling).
constexpr std::string_view WireDtypeName(WireDtype dtype) {
  return dtype == WireDtype::kBFloat16 ? "bf16" : dtype == WireDtype::kFloat16 ? "f16" : "fp32";
}

// Everything about one Attend call besides the model and the input. Defaults: self-attention, no
// mask, no weights, the client's default deadline, raw float32 bytes on the wire.
struct AttendOptions {
  // Cross-attention: keys and values come from `memory` ([S, d_model] or [B, S, d_model]).
  std::optional<TensorView> memory = {};
  // Valid length of each of the B sequences of a rank-3 input (and memory); empty = all full.
  std::vector<int32_t> lengths = {};
  std::vector<int32_t> memory_lengths = {};
  Mask mask = Mask::kNone;
  // Optional explicit mask [T, S] or [B, T, S]: 0 = blocked, any other finite value = allowed
  // (non-finite values are refused). Sent as float32 whatever wire_dtype is, so every value
  // keeps that meaning.
  std::optional<TensorView> attn_mask = {};
  // Optional, one per head: false disables the head.
  std::vector<bool> head_mask = {};
  bool return_weights = false;
  // Echoed back in the result; the streaming session fills in a unique one when empty.
  std::string request_id = {};
  // 0 = ClientOptions::default_deadline.
  std::chrono::milliseconds deadline{0};
  // Send and receive raw little-endian bytes (fast) instead of repeated floats.
  bool raw = true;
  // With raw: the encoding of the data sent (input, memory; rounded to nearest, ties to even; not
  // attn_mask, always float32) and of the answer's bytes (output, weights; the server rounds, this
  // library widens them back exactly). Either 16-bit type needs raw (InvalidArgument otherwise).
  WireDtype wire_dtype = WireDtype::kFloat32;
  WireDtype answer_wire_dtype = WireDtype::kFloat32;
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
  // The serialized protobuf sizes of the request sent and the answer received, in bytes (before
  // gRPC's framing and any compression).
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
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
  std::string server_version = {};  // The attnserve release that answered, e.g. "1.0.0".
  // What decoding sessions' KV cache stores: "fp32", "bf16" or "int8" ("" from an older server).
  std::string kv_cache_dtype = {};
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_TYPES_H_
