#include "core/model/model_config.h"

#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/model/json_text.h"
#include "core/model/sha256.h"
#include "nlohmann/json.hpp"

namespace attnserve::model {
namespace {

using nlohmann::json;

// A short rendering of a JSON value for error messages.
std::string Render(const json& value) { return JsonSnippet(value, 37); }

absl::Status BadValue(const std::string& key, std::string_view expected, const json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("\"", key, "\" must be ", std::string(expected), ", got ", Render(value)));
}

absl::StatusOr<int64_t> ReadInteger(const std::string& key, const json& value, int64_t min) {
  const std::string expected = absl::StrCat("an integer >= ", min);
  if (!value.is_number_integer()) return BadValue(key, expected, value);
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return BadValue(key, expected, value);
  }
  const int64_t v = value.get<int64_t>();
  if (v < min) return BadValue(key, expected, value);
  return v;
}

absl::StatusOr<std::string> ReadString(const std::string& key, const json& value) {
  if (!value.is_string()) return BadValue(key, "a string", value);
  return value.get<std::string>();
}

absl::Status ParseBatching(const json& object, BatchingOverrides& out) {
  if (!object.is_object()) return BadValue("batching", "an object", object);
  for (const auto& [key, value] : object.items()) {
    const std::string path = "batching." + key;
    std::optional<int64_t>* field = nullptr;
    int64_t min = 1;
    if (key == "max_batch_sequences") {
      field = &out.max_batch_sequences;
    } else if (key == "max_batch_tokens") {
      field = &out.max_batch_tokens;
    } else if (key == "max_queue_delay_us") {
      field = &out.max_queue_delay_us;
      min = 0;
    } else if (key == "max_queue_size") {
      field = &out.max_queue_size;
    } else if (key == "max_queued_bytes") {
      field = &out.max_queued_bytes;
      min = 0;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown key \"", path,
                       "\"; expected max_batch_sequences, max_batch_tokens, max_queue_delay_us, "
                       "max_queue_size or max_queued_bytes"));
    }
    absl::StatusOr<int64_t> v = ReadInteger(path, value, min);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  return absl::OkStatus();
}

// Applies one top-level key to `config`.
absl::Status ParseKey(const std::string& key, const json& value, ModelConfig& config) {
  core::AttentionConfig& attention = config.attention;
  if (key == "d_model" || key == "num_heads") {
    absl::StatusOr<int64_t> v = ReadInteger(key, value, 1);
    if (!v.ok()) return v.status();
    (key == "d_model" ? attention.d_model : attention.num_heads) = *v;
  } else if (key == "variant") {
    absl::StatusOr<std::string> name = ReadString(key, value);
    if (!name.ok()) return name.status();
    absl::StatusOr<core::AttentionVariant> variant = core::ParseVariant(*name);
    if (!variant.ok()) return BadValue(key, "\"multi_head\" or \"single_head\"", value);
    attention.variant = *variant;
  } else if (key == "bias") {
    if (!value.is_boolean()) return BadValue(key, "true or false", value);
    attention.bias = value.get<bool>();
  } else if (key == "dtype") {
    const std::string fp32(core::ComputeTypeName(core::ComputeType::kFloat32));
    if (!value.is_string() || value.get<std::string>() != fp32) {
      return BadValue(key, "\"" + fp32 + "\"", value);
    }
  } else if (key == "compute_dtype") {
    // The arithmetic, independent of the weights file's stored dtype (F32, F16 or BF16).
    if (!value.is_string()) return BadValue(key, "\"fp32\" or \"bf16\"", value);
    absl::StatusOr<core::ComputeType> type = core::ParseComputeType(value.get<std::string>());
    if (!type.ok()) return BadValue(key, "\"fp32\" or \"bf16\"", value);
    attention.compute_type = *type;
  } else if (key == "max_sequence_length") {
    absl::StatusOr<int64_t> v = ReadInteger(key, value, 1);
    if (!v.ok()) return v.status();
    config.max_sequence_length = *v;
  } else if (key == "batching") {
    return ParseBatching(value, config.batching);
  } else if (key == "kv_cache_dtype") {
    absl::StatusOr<KvCacheDtype> dtype = value.is_string()
                                             ? ParseKvCacheDtype(value.get<std::string>())
                                             : absl::InvalidArgumentError("not a string");
    if (!dtype.ok()) return BadValue(key, "\"auto\" or \"int8\"", value);
    config.kv_cache_dtype = *dtype;
  } else if (key == "weights_sha256") {
    // A digest that cannot be one is refused here, as a config error naming the key, rather than
    // reported at load time as a mismatch that no weights file could ever fix.
    if (!value.is_string() || !IsSha256Hex(value.get<std::string>())) {
      return BadValue(
          key, "64 hex digits (the SHA-256 of weights.safetensors, as sha256sum prints it)", value);
    }
    config.weights_sha256 = absl::AsciiStrToLower(value.get<std::string>());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown key \"", key,
                     "\"; expected d_model, num_heads, variant, bias, dtype, compute_dtype, "
                     "max_sequence_length, batching, kv_cache_dtype or weights_sha256"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view KvCacheDtypeName(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kInt8 ? "int8" : "auto";
}

absl::StatusOr<KvCacheDtype> ParseKvCacheDtype(std::string_view name) {
  if (name == "auto") return KvCacheDtype::kAuto;
  if (name == "int8") return KvCacheDtype::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("KV cache dtype must be \"auto\" or \"int8\", got \"", std::string(name), "\""));
}

std::string_view KvCacheStorageName(const ModelConfig& config) {
  if (config.kv_cache_dtype == KvCacheDtype::kInt8) return "int8";
  return core::ComputeTypeName(config.attention.compute_type);
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  absl::StatusOr<json> parsed = ParseJson(json_text, "the file");
  if (!parsed.ok()) return parsed.status();
  const json& root = *parsed;
  if (!root.is_object()) return BadValue("(top level)", "an object", root);
  for (const char* required : {"d_model", "num_heads"}) {
    if (!root.contains(required)) {
      return absl::InvalidArgumentError(absl::StrCat("missing required key \"", required, "\""));
    }
  }
  ModelConfig config;
  config.attention.bias = false;
  config.attention.variant = core::AttentionVariant::kMultiHead;
  for (const auto& [key, value] : root.items()) {
    if (absl::Status s = ParseKey(key, value, config); !s.ok()) return s;
  }
  if (absl::Status s = config.attention.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(std::string(s.message()));
  }
  return config;
}

std::string ModelConfigToJson(const ModelConfig& config) {
  const core::AttentionConfig& a = config.attention;
  json root = json::object();
  root["d_model"] = a.d_model;
  root["num_heads"] = a.num_heads;
  root["variant"] = std::string(core::VariantName(a.variant));
  root["bias"] = a.bias;
  root["compute_dtype"] = std::string(core::ComputeTypeName(a.compute_type));
  if (config.max_sequence_length) root["max_sequence_length"] = *config.max_sequence_length;
  json batching = json::object();
  const BatchingOverrides& b = config.batching;
  if (b.max_batch_sequences) batching["max_batch_sequences"] = *b.max_batch_sequences;
  if (b.max_batch_tokens) batching["max_batch_tokens"] = *b.max_batch_tokens;
  if (b.max_queue_delay_us) batching["max_queue_delay_us"] = *b.max_queue_delay_us;
  if (b.max_queue_size) batching["max_queue_size"] = *b.max_queue_size;
  if (b.max_queued_bytes) batching["max_queued_bytes"] = *b.max_queued_bytes;
  if (!batching.empty()) root["batching"] = batching;
  if (config.kv_cache_dtype) {
    root["kv_cache_dtype"] = std::string(KvCacheDtypeName(*config.kv_cache_dtype));
  }
  if (config.weights_sha256) root["weights_sha256"] = *config.weights_sha256;
  return root.dump(2) + "\n";
}

}  // namespace attnserve::model
