// JsonPrefix: the start of a JSON value's compact text, for error messages. Internal to
// attnserve_model (it exposes nlohmann::json, a private dependency).
#ifndef ATTNSERVE_CORE_MODEL_JSON_TEXT_H_
#define ATTNSERVE_CORE_MODEL_JSON_TEXT_H_

#include <cstddef>
#include <string>

#include "nlohmann/json.hpp"

namespace attnserve::model {

// The first `max_chars` + 1 characters of value.dump() (all of it when shorter), so a caller
// can tell that the text was cut. dump() recurses once per nesting level and overflows the stack
// on a deeply nested value (a 200 KB header of '[' is enough); this stops descending once it has
// the characters it needs, so it recurses at most max_chars + 2 levels. Never throws: invalid
// UTF-8 (e.g. a string cut inside a character) is replaced.
std::string JsonPrefix(const nlohmann::json& value, size_t max_chars);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_JSON_TEXT_H_
