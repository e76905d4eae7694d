// JSON helpers shared by safetensors headers and config.json: parsing that refuses what
// nlohmann::json would otherwise accept silently (duplicate keys) or choke on (deep nesting), and
// short renderings of values for error messages. Internal to attnserve_model: it exposes
// nlohmann::json, a private dependency. Pure functions; thread-safe.
#ifndef ATTNSERVE_CORE_MODEL_JSON_TEXT_H_
#define ATTNSERVE_CORE_MODEL_JSON_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace attnserve::model {

// Deeper nesting is refused before parsing. Valid headers nest 3 levels and configs 2; the bound
// keeps the parser's memory and the recursion of dump() and of the destructor small whatever a
// file holds (500,000 '[' used to overflow the stack in dump()).
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` (the whole of it) as JSON. `what` names the text in messages ("header",
// "config.json"). InvalidArgument "<what> nests deeper than 64 levels (at byte N)", "<what> is
// not valid JSON: <parser's message>" (including numbers out of range, e.g. 1e400), or
// "<what> has duplicate key "k"" (+ " inside "parent"" below the top level; the parser would keep
// the last one silently). ResourceExhausted when memory runs out.
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what);

// value.dump() cut to `max_chars` characters plus "..." when longer; invalid UTF-8 is replaced,
// never thrown. Meant for values from ParseJson (bounded depth).
std::string JsonSnippet(const nlohmann::json& value, size_t max_chars);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_JSON_TEXT_H_
