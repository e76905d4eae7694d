// ModelConfig: the contents of a model folder's config.json.
//
//   {"d_model": 512, "num_heads": 8, "variant": "multi_head", "bias": true, "dtype": "fp32",
//    "max_sequence_length": 4096, "kv_cache_dtype": "int8",
//    "batching": {"max_batch_sequences": 64, "max_batch_tokens": 8192,
//                 "max_queue_delay_us": 1000, "max_queue_size": 1024,
//                 "max_queued_bytes": 268435456},
//    "weights_sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}
//
// Required: d_model, num_heads. Defaults: variant "multi_head", bias false, compute_dtype "fp32"
// ("fp32" or "bf16": the arithmetic, independent of the weights file's F32, F16 or BF16; the
// older key "dtype" accepts only "fp32"). max_sequence_length and every
// batching key are optional overrides of the server's defaults. weights_sha256, when present, is
// the SHA-256 of weights.safetensors that a load verifies (model.h); absent, nothing is checked.
// kv_cache_dtype ("auto" or "int8"; absent: the server's --kv-cache-dtype) is what decoding
// sessions' KV cache stores (KvCacheDtype).
// Any other key is an error naming it. A plain value type.
#ifndef ATTNSERVE_CORE_MODEL_MODEL_CONFIG_H_
#define ATTNSERVE_CORE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/forward/attention_config.h"

namespace attnserve::model {

// Per-model overrides of the server's batching options; unset = the server's default. Every set
// value is ≥ 1 (max_queue_delay_us and max_queued_bytes ≥ 0).
struct BatchingOverrides {
  std::optional<int64_t> max_batch_sequences;
  std::optional<int64_t> max_batch_tokens;
  std::optional<int64_t> max_queue_delay_us;
  std::optional<int64_t> max_queue_size;
  std::optional<int64_t> max_queued_bytes;

  bool operator==(const BatchingOverrides&) const = default;
};

// What a model's KV cache (decoding sessions) stores K and V as.
enum class KvCacheDtype {
  kAuto,  // The compute type's elements, fp32 or bf16: cached steps equal the full forward.
  // int8 with a scale per token and head: half of bf16's bytes per token (a quarter of fp32's),
  // so twice the sessions per budget and a faster step over a long past; outputs within ~1e-2
  // (relative) of an fp32 cache's.
  kInt8,
};

// "auto" or "int8".
std::string_view KvCacheDtypeName(KvCacheDtype dtype);
// The inverse of KvCacheDtypeName; InvalidArgument for any other text.
absl::StatusOr<KvCacheDtype> ParseKvCacheDtype(std::string_view name);

struct ModelConfig {
  core::AttentionConfig attention;
  // Longest query or memory sequence a request may send; unset = the server's default.
  std::optional<int64_t> max_sequence_length;
  BatchingOverrides batching;
  // Unset = the server's default (model::LoadOptions::default_kv_cache_dtype); a loaded Model's
  // is always set.
  std::optional<KvCacheDtype> kv_cache_dtype;
  // The SHA-256 of the whole weights.safetensors file as 64 lowercase hex digits (sha256.h;
  // config.json may spell it in either case); unset = the weights are not verified.
  std::optional<std::string> weights_sha256;
};

// What `config`'s KV cache stores, as ModelInfo, the startup summary and the KV metrics name it:
// "int8" for kv_cache_dtype int8, else the compute type ("fp32" or "bf16").
std::string_view KvCacheStorageName(const ModelConfig& config);

// Parses and validates config.json text. InvalidArgument naming the key (e.g. "batching.
// max_queue_size"), the expected and the actual value, for bad JSON, a missing required key, a
// wrong type, an invalid value (including an invalid AttentionConfig, or a weights_sha256 that is
// not 64 hex digits) or an unknown key.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);

// config.json text for `config` (pretty-printed, unset optionals omitted); ParseModelConfig of
// the result gives `config` back.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_MODEL_CONFIG_H_
