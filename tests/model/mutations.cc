#include "tests/model/mutations.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::testing {
namespace {

// One JSON token of a header: its byte range and kind ('s' string, 'n' number, 'l' literal such
// as true/null, or the punctuation character itself).
struct Token {
  size_t begin;
  size_t end;
  char kind;
};

// A forgiving lexer: it only needs to find tokens in (possibly already mutated) JSON text.
std::vector<Token> Tokenize(std::string_view text) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      ++i;
    } else if (c == '"') {
      size_t j = i + 1;
      while (j < text.size() && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, text.size());
      tokens.push_back({i, j, 's'});
      i = j;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t j = i + 1;
      while (j < text.size() && std::strchr("0123456789.eE+-", text[j]) != nullptr) ++j;
      tokens.push_back({i, j, 'n'});
      i = j;
    } else if (c >= 'a' && c <= 'z') {
      size_t j = i + 1;
      while (j < text.size() && text[j] >= 'a' && text[j] <= 'z') ++j;
      tokens.push_back({i, j, 'l'});
      i = j;
    } else {
      tokens.push_back({i, i + 1, c});
      ++i;
    }
  }
  return tokens;
}

// The token index just past the value that starts at token `first` (a whole array or object).
size_t ValueEnd(const std::vector<Token>& tokens, size_t first) {
  if (first >= tokens.size()) return tokens.size();
  if (tokens[first].kind != '[' && tokens[first].kind != '{') return first + 1;
  int depth = 0;
  for (size_t i = first; i < tokens.size(); ++i) {
    if (tokens[i].kind == '[' || tokens[i].kind == '{') ++depth;
    if (tokens[i].kind == ']' || tokens[i].kind == '}') --depth;
    if (depth == 0) return i + 1;
  }
  return tokens.size();
}

constexpr std::array<std::string_view, 40> kNumbers = {"0",          "-0",
                                                       "1",          "-1",
                                                       "2",          "3",
                                                       "4",          "8",
                                                       "16",         "63",
                                                       "64",         "65",
                                                       "255",        "4096",
                                                       "1e400",      "-1e400",
                                                       "1.5",        "4.0",
                                                       "1e2",        "1E5",
                                                       "-4",         "2147483648",
                                                       "4294967296", "9223372036854775807",
                                                       "00",         "01",
                                                       "-",          "1e",
                                                       "0x10",       "9223372036854775808",
                                                       "NaN",        "1e-5",
                                                       "-0.0",       "65536",
                                                       "4294967295", "18446744073709551615",
                                                       "true",       "\"4\"",
                                                       "[4]",        "18446744073709551616"};

constexpr std::array<std::string_view, 40> kValues = {
    "\"\"",
    "\"W_Q\"",
    "\"W_O\"",
    "\"b_Q\"",
    "\"in_proj_weight\"",
    "\"in_proj_bias\"",
    "\"out_proj.weight\"",
    "\"q_proj.weight\"",
    "\"o_proj.weight\"",
    "\"__metadata__\"",
    "\"dtype\"",
    "\"shape\"",
    "\"data_offsets\"",
    "\"F32\"",
    "\"F16\"",
    "\"BF16\"",
    "\"F64\"",
    "\"I8\"",
    "\"BOOL\"",
    "\"U64\"",
    "\"F8_E4M3\"",
    "\"f32\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\xc3\xa9\"",
    "\"\xff\"",
    "\"\\\"\"",
    "[]",
    "{}",
    "null",
    "true",
    "[0]",
    "[0,0]",
    "[0,0,0]",
    "[[4]]",
    "{\"a\":1}",
    "{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}",
    "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
    "]]",
    "-1"};

constexpr std::array<std::string_view, 16> kSnippets = {"\"",
                                                        "{",
                                                        "}",
                                                        "[",
                                                        "]",
                                                        ",",
                                                        ":",
                                                        "\\",
                                                        "\\u",
                                                        "\xff",
                                                        std::string_view("\0", 1),
                                                        "0",
                                                        "-1",
                                                        " ",
                                                        "\xef\xbb\xbf",
                                                        ",\"x\":1"};

}  // namespace

std::string MutateJson(std::string& json, Rng& rng) {
  const std::vector<Token> tokens = Tokenize(json);
  if (tokens.empty()) return "empty";
  // Members: key string tokens followed by ':'.
  std::vector<size_t> keys;
  std::vector<size_t> numbers;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    if (tokens[i].kind == 's' && tokens[i + 1].kind == ':') keys.push_back(i);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].kind == 'n') numbers.push_back(i);
  }
  const auto text_of = [&](size_t first, size_t last) {  // Tokens [first, last).
    return json.substr(tokens[first].begin, tokens[last - 1].end - tokens[first].begin);
  };
  switch (rng.Below(6)) {
    case 0: {
      if (numbers.empty()) break;
      const Token& t = tokens[numbers[rng.Below(numbers.size())]];
      const std::string with(rng.Pick(kNumbers));
      json.replace(t.begin, t.end - t.begin, with);
      return absl::StrCat("number at ", t.begin, " -> ", with);
    }
    case 1: {
      if (keys.empty()) break;
      const size_t key = keys[rng.Below(keys.size())];
      if (key + 2 >= tokens.size()) break;
      const size_t value_end = ValueEnd(tokens, key + 2);
      const std::string with(rng.Pick(kValues));
      const size_t begin = tokens[key + 2].begin;
      json.replace(begin, tokens[value_end - 1].end - begin, with);
      return absl::StrCat("value at ", begin, " -> ", with);
    }
    case 2: {  // Duplicate a member, with its own or another member's value.
      if (keys.empty()) break;
      const size_t key = keys[rng.Below(keys.size())];
      if (key + 2 >= tokens.size()) break;
      const size_t value_end = ValueEnd(tokens, key + 2);
      std::string member = text_of(key, value_end);
      const size_t other = keys[rng.Below(keys.size())];
      if (rng.OneIn(2) && other + 2 < tokens.size()) {
        member = absl::StrCat(text_of(key, key + 1), ":",
                              text_of(other + 2, ValueEnd(tokens, other + 2)));
      }
      json.insert(tokens[value_end - 1].end, absl::StrCat(",", member));
      return absl::StrCat("duplicate member at ", tokens[key].begin);
    }
    case 3: {  // Delete a member and the comma before or after it.
      if (keys.empty()) break;
      const size_t key = keys[rng.Below(keys.size())];
      size_t first = key;
      size_t last = ValueEnd(tokens, key + 2);
      if (last < tokens.size() && tokens[last].kind == ',') {
        ++last;
      } else if (first > 0 && tokens[first - 1].kind == ',') {
        --first;
      }
      json.erase(tokens[first].begin, tokens[last - 1].end - tokens[first].begin);
      return absl::StrCat("delete member at ", tokens[key].begin);
    }
    case 4: {  // Rename a key to another key of the file.
      if (keys.empty()) break;
      const Token& t = tokens[keys[rng.Below(keys.size())]];
      const size_t other = keys[rng.Below(keys.size())];
      const std::string with = text_of(other, other + 1);
      json.replace(t.begin, t.end - t.begin, with);
      return absl::StrCat("rename key at ", t.begin, " -> ", with);
    }
    case 5: {  // Swap two scalar tokens.
      const size_t a = rng.Below(tokens.size());
      const size_t b = rng.Below(tokens.size());
      if (a == b) break;
      const Token& first = tokens[std::min(a, b)];
      const Token& second = tokens[std::max(a, b)];
      const std::string x = json.substr(first.begin, first.end - first.begin);
      const std::string y = json.substr(second.begin, second.end - second.begin);
      json.replace(second.begin, y.size(), x);
      json.replace(first.begin, x.size(), y);
      return absl::StrCat("swap tokens at ", first.begin, " and ", second.begin);
    }
  }
  return "no-op";
}

std::string MutateBytes(std::string& text, size_t from, size_t to, Rng& rng) {
  if (to <= from) return "no-op";
  const size_t at = from + rng.Below(to - from);
  switch (rng.Below(4)) {
    case 0: {
      const size_t flips = 1 + rng.Below(4);
      for (size_t i = 0; i < flips; ++i) {
        text[from + rng.Below(to - from)] ^= static_cast<char>(1u << rng.Below(8));
      }
      return absl::StrCat(flips, " bit flips");
    }
    case 1: {
      const size_t count = std::min<size_t>(1 + rng.Below(4), text.size() - at);
      for (size_t i = 0; i < count; ++i) {
        text[at + i] = rng.OneIn(2) ? static_cast<char>(rng.Below(256)) : rng.Pick(kSnippets)[0];
      }
      return absl::StrCat("overwrite ", count, " at ", at);
    }
    case 2: {
      const std::string_view snippet = rng.Pick(kSnippets);
      text.insert(at, snippet);
      return absl::StrCat("insert at ", at);
    }
    default: {
      const size_t count = std::min<size_t>(1 + rng.Below(8), to - at);
      text.erase(at, count);
      return absl::StrCat("delete ", count, " at ", at);
    }
  }
}

}  // namespace attnserve::testing
