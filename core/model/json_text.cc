#include "core/model/json_text.h"

#include <string_view>

namespace attnserve::model {
namespace {

using Json = nlohmann::json;

// `s` as a JSON string literal, cut to its first `max_chars` + 1 bytes first.
std::string StringLiteral(std::string_view s, size_t max_chars) {
  if (s.size() > max_chars) s = s.substr(0, max_chars + 1);
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Appends `value` as dump() would, stopping once `out` holds more than `max_chars` characters.
void Append(const Json& value, size_t max_chars, std::string& out) {
  if (out.size() > max_chars) return;
  if (value.is_string()) {
    out += StringLiteral(value.get_ref<const std::string&>(), max_chars);
    return;
  }
  if (!value.is_structured()) {
    out += value.dump(-1, ' ', false, Json::error_handler_t::replace);
    return;
  }
  const bool is_object = value.is_object();
  out += is_object ? '{' : '[';
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (out.size() > max_chars) return;
    if (it != value.begin()) out += ',';
    if (is_object) {
      out += StringLiteral(it.key(), max_chars);
      out += ':';
    }
    Append(it.value(), max_chars, out);
  }
  out += is_object ? '}' : ']';
}

}  // namespace

std::string JsonPrefix(const Json& value, size_t max_chars) {
  std::string text;
  Append(value, max_chars, text);
  if (text.size() > max_chars + 1) text.resize(max_chars + 1);
  return text;
}

}  // namespace attnserve::model
