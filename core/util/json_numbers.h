// JSON arrays of numbers, fast: the tensors of the Open Inference Protocol's REST binding are
// arrays of thousands of numbers, which a general JSON parser reads one token at a time through
// strtod. Written once here for the server's REST conversion and the CLI's REST client.
//
// AppendJsonFloats writes FP32 values in their shortest form that reads back as the same value
// (std::to_chars; -0 as "-0.0", since "-0" reads as the integer 0). ParseJsonNumberArray reads a
// (possibly nested) array of JSON numbers, each read as a double (std::from_chars, correctly
// rounded), so that rounding it to FP32 afterwards is what json.loads then numpy.float32 do.
// ExtractJsonNumberArrays lifts every such array that is the value of a given key out of a JSON
// text, so that the general parser sees only the small rest.
//
// Header-only; pure functions, thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_JSON_NUMBERS_H_
#define ATTNSERVE_CORE_UTIL_JSON_NUMBERS_H_

#include <charconv>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attnserve {

// Appends `values` as a JSON array to *out.
inline void AppendJsonFloats(std::span<const float> values, std::string* out) {
  const size_t start = out->size();
  // A float's shortest form has at most 15 characters; one more for the separator.
  out->resize(start + 2 + values.size() * 16);
  char* cursor = out->data() + start;
  char* const end = out->data() + out->size();
  *cursor++ = '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) *cursor++ = ',';
    if (values[i] == 0.0f && std::signbit(values[i])) {
      std::memcpy(cursor, "-0.0", 4);
      cursor += 4;
      continue;
    }
    cursor = std::to_chars(cursor, end, values[i]).ptr;
  }
  *cursor++ = ']';
  out->resize(static_cast<size_t>(cursor - out->data()));
}

namespace json_numbers_internal {

inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The length of the JSON number at the start of `text` (RFC 8259's grammar), 0 if none.
inline size_t NumberLength(std::string_view text) {
  size_t i = 0;
  if (i < text.size() && text[i] == '-') ++i;
  if (i >= text.size()) return 0;
  if (text[i] == '0') {
    ++i;
  } else if (IsDigit(text[i])) {
    while (i < text.size() && IsDigit(text[i])) ++i;
  } else {
    return 0;
  }
  if (i < text.size() && text[i] == '.') {
    const size_t start = ++i;
    while (i < text.size() && IsDigit(text[i])) ++i;
    if (i == start) return 0;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    const size_t start = i;
    while (i < text.size() && IsDigit(text[i])) ++i;
    if (i == start) return 0;
  }
  return i;
}

}  // namespace json_numbers_internal

// Reads the array at the start of `text` (text[0] == '['), nested at most `max_depth` deep, of
// numbers only, appending them flattened (row-major) to *out. Returns the array's length in
// characters, or 0 when it is anything else (strings, booleans, null, objects, malformed
// syntax, a number beyond FP32's range), leaving *out as it was: the caller's general parser
// then reads it and names what is wrong.
inline size_t ParseJsonNumberArray(std::string_view text, int max_depth, std::vector<double>* out) {
  using json_numbers_internal::IsSpace;
  const size_t restore = out->size();
  int depth = 0;
  // After '[' or ',' a value must come; after a value or ']' a ',' or ']'.
  bool expect_value = true;
  bool empty_allowed = true;  // Just after '['.
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (IsSpace(c)) {
      ++i;
    } else if (c == '[') {
      if (!expect_value || ++depth > max_depth) break;
      empty_allowed = true;
      ++i;
    } else if (c == ']') {
      if (expect_value && !empty_allowed) break;
      expect_value = false;
      empty_allowed = false;
      ++i;
      if (--depth == 0) return i;
    } else if (c == ',') {
      if (expect_value || depth == 0) break;
      expect_value = true;
      empty_allowed = false;
      ++i;
    } else {
      if (!expect_value || depth == 0) break;
      const size_t length = json_numbers_internal::NumberLength(text.substr(i));
      double value = 0;
      if (length == 0 ||
          std::from_chars(text.data() + i, text.data() + i + length, value).ec != std::errc()) {
        break;
      }
      if (!std::isfinite(static_cast<float>(value))) break;
      out->push_back(value);
      expect_value = false;
      empty_allowed = false;
      i += length;
    }
  }
  out->resize(restore);
  return 0;
}

// Every array of numbers that is the value of `key` ("key": [...], outside strings) in `json`
// is parsed (ParseJsonNumberArray) and appended to *arrays, in order of appearance, and replaced
// in the returned text by the object {"<marker>": i}, i its index in *arrays. Other values of
// `key` are left alone. The text is not otherwise checked: the general parser does that.
inline std::string ExtractJsonNumberArrays(std::string_view json, std::string_view key,
                                           std::string_view marker, int max_depth,
                                           std::vector<std::vector<double>>* arrays) {
  using json_numbers_internal::IsSpace;
  std::string reduced;
  size_t copied = 0;  // json[0, copied) is in `reduced`.
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] != '"') continue;
    // A string: find its end, honouring escapes.
    const size_t start = i;
    for (++i; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] == '\\') ++i;
    }
    if (i >= json.size()) break;
    if (json.substr(start + 1, i - start - 1) != key) continue;
    size_t j = i + 1;
    while (j < json.size() && IsSpace(json[j])) ++j;
    if (j >= json.size() || json[j] != ':') continue;
    ++j;
    while (j < json.size() && IsSpace(json[j])) ++j;
    if (j >= json.size() || json[j] != '[') continue;
    std::vector<double> values;
    const size_t length = ParseJsonNumberArray(json.substr(j), max_depth, &values);
    if (length == 0) continue;
    if (reduced.empty()) reduced.reserve(json.size() / 4 + 64);
    reduced.append(json.substr(copied, j - copied));
    reduced.append("{\"").append(marker).append("\":").append(std::to_string(arrays->size()));
    reduced.push_back('}');
    arrays->push_back(std::move(values));
    copied = j + length;
    i = copied - 1;
  }
  if (arrays->empty()) return std::string(json);
  reduced.append(json.substr(copied));
  return reduced;
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_JSON_NUMBERS_H_
