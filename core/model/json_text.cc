#include "core/model/json_text.h"

#include <functional>
#include <new>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::model {
namespace {

using Json = nlohmann::json;

// The byte offset where `text` first nests deeper than `max_depth`, or nullopt. Brackets inside
// strings do not count.
std::optional<size_t> FindTooDeep(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // Skip the escaped character.
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

// Notes the first duplicate key while nlohmann builds the document.
class DuplicateKeyFinder {
 public:
  bool operator()(int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      keys_.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!keys_.empty()) keys_.pop_back();
    } else if (event == Json::parse_event_t::key && !keys_.empty() && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (depth == 1) top_level_key_ = key;
      if (!keys_.back().insert(key).second && !duplicate_) {
        duplicate_ =
            absl::StrCat("duplicate key \"", key, "\"",
                         depth == 1 ? "" : absl::StrCat(" inside \"", top_level_key_, "\""));
      }
    }
    return true;
  }

  const std::optional<std::string>& duplicate() const { return duplicate_; }

 private:
  std::vector<std::set<std::string>> keys_;  // One key set per open object.
  std::string top_level_key_;
  std::optional<std::string> duplicate_;
};

}  // namespace

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what_view) {
  const std::string what(what_view);
  if (std::optional<size_t> at = FindTooDeep(text, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " nests deeper than ", kMaxJsonDepth, " levels (at byte ", *at, ")"));
  }
  DuplicateKeyFinder finder;
  Json value;
  try {
    value = Json::parse(text.begin(), text.end(), std::ref(finder));
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number like 1e400.
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory while parsing"));
  }
  if (finder.duplicate()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", *finder.duplicate()));
  }
  return value;
}

std::string JsonSnippet(const Json& value, size_t max_chars) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > max_chars) text = absl::StrCat(text.substr(0, max_chars), "...");
  return text;
}

}  // namespace attnserve::model
