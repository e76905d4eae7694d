// EchoForMessage: a caller-supplied string shortened for quoting in an error message or a log line.
//
// Errors name what the caller sent, but a gRPC status message travels in the response's trailing
// metadata, whose default size limit is 8 KiB: quoting an 8,000-character model name whole turns
// the caller's NOT_FOUND into the client library's RESOURCE_EXHAUSTED ("metadata size exceeds
// limit"), and it floods logs. A pure function; thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_ECHO_H_
#define ATTNSERVE_CORE_UTIL_ECHO_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace attnserve {

// The longest caller-supplied string quoted whole in a message.
inline constexpr size_t kMaxEchoBytes = 128;

// `text` itself when it has at most `max_bytes` bytes; otherwise its first `max_bytes` bytes (cut
// back to a UTF-8 character boundary) followed by "...(N bytes)".
inline std::string EchoForMessage(std::string_view text, size_t max_bytes = kMaxEchoBytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Continuation bytes are 10xxxxxx: never end the prefix inside a character.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(absl::string_view(text.data(), cut), "...(", text.size(), " bytes)");
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_ECHO_H_
