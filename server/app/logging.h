// Logging set-up for the attnserve binary: spdlog to stderr, as text or as one JSON object per
// line (for log collectors); gRPC's own log lines (TLS handshake failures) go the same way. Call
// once at start, before other threads log.
#ifndef ATTNSERVE_SERVER_APP_LOGGING_H_
#define ATTNSERVE_SERVER_APP_LOGGING_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace attnserve::server {

// `level`: trace, debug, info, warn, error, critical or off. `format`: "text" or "json". JSON
// lines look like {"time":"2026-11-29T14:51:07.123+00:00","level":"info","thread":12,
// "msg":"..."} with the message escaped. InvalidArgument naming the flag for other values.
absl::Status ConfigureLogging(std::string_view level, std::string_view format);

// `text` escaped for use inside a JSON string (quotes, backslashes, control characters).
std::string JsonEscape(std::string_view text);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_LOGGING_H_
