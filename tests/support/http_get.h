// HttpGet: a minimal blocking HTTP/1.0 GET against 127.0.0.1, for tests that read a server's
// /metrics page as Prometheus would. Not a general HTTP client: no redirects, no chunking (an
// HTTP/1.0 request gets neither), no TLS.
#ifndef ATTNSERVE_TESTS_SUPPORT_HTTP_GET_H_
#define ATTNSERVE_TESTS_SUPPORT_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnserve::testing {

// The body of GET http://127.0.0.1:<port><path>. Unavailable when the connection fails or times
// out; Internal for an answer that is not "HTTP/1.x 200".
absl::StatusOr<std::string> HttpGet(int port, const std::string& path,
                                    absl::Duration timeout = absl::Seconds(10));

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SUPPORT_HTTP_GET_H_
