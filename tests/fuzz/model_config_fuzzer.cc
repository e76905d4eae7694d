// Fuzzes config.json parsing: the JSON layer (core/model/json_text.h: depth limit, duplicate
// keys, snippets for messages), ParseModelConfig on the same bytes, and what the server derives
// from an accepted config (server/runtime/model_limits.h).
//
// Invariants, beyond "no crash, no sanitizer report": a refused config is INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED when the JSON parser runs out of memory); text ParseJson refuses is never a
// config; an accepted config is valid, survives ModelConfigToJson and back unchanged, and gives
// model limits that validate (the server's defaults with its overrides applied).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/json_text.h"
#include "core/model/model_config.h"
#include "nlohmann/json.hpp"
#include "server/runtime/model_limits.h"
#include "tests/fuzz/fuzz_check.h"

namespace attnserve::fuzz {
namespace {

bool RefusedAsDocumented(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ||
         status.code() == absl::StatusCode::kResourceExhausted;
}

bool SameConfig(const model::ModelConfig& a, const model::ModelConfig& b) {
  return a.attention.d_model == b.attention.d_model &&
         a.attention.num_heads == b.attention.num_heads &&
         a.attention.variant == b.attention.variant && a.attention.bias == b.attention.bias &&
         a.attention.compute_type == b.attention.compute_type &&
         a.max_sequence_length == b.max_sequence_length && a.batching == b.batching;
}

void CheckConfig(std::string_view text) {
  absl::StatusOr<nlohmann::json> json = model::ParseJson(text, "config.json");
  if (json.ok()) {
    // Error messages quote values this way; it must never throw, whatever the strings hold.
    FuzzCheck(model::JsonSnippet(*json, 37).size() <= 40, "JsonSnippet longer than asked");
  } else {
    FuzzCheck(RefusedAsDocumented(json.status()), "ParseJson", json.status());
  }

  absl::StatusOr<model::ModelConfig> config = model::ParseModelConfig(text);
  if (!config.ok()) {
    FuzzCheck(RefusedAsDocumented(config.status()), "ParseModelConfig", config.status());
    return;
  }
  FuzzCheck(json.ok(), "ParseModelConfig accepted text ParseJson refuses");
  FuzzCheck(config->attention.Validate().ok(), "ParseModelConfig accepted an invalid config");

  absl::StatusOr<model::ModelConfig> again =
      model::ParseModelConfig(model::ModelConfigToJson(*config));
  FuzzCheck(again.ok(), "ParseModelConfig of ModelConfigToJson", again.status());
  FuzzCheck(SameConfig(*config, *again), "ModelConfigToJson then ParseModelConfig changed it");

  const server::ModelLimits limits = server::ApplyModelConfig(server::ModelLimits{}, *config);
  const absl::Status valid = server::ValidateModelLimits(limits);
  FuzzCheck(valid.ok(), "the limits of an accepted config do not validate", valid);
}

}  // namespace
}  // namespace attnserve::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnserve::fuzz::CheckConfig(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
