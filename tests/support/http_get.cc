#include "tests/support/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attnserve::testing {
namespace {

// Closes the socket on every return path.
class Socket {
 public:
  Socket() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::string> HttpGet(int port, const std::string& path, absl::Duration timeout) {
  Socket socket;
  if (socket.fd() < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  const timeval limit = absl::ToTimeval(timeout);
  setsockopt(socket.fd(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(socket.fd(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect to 127.0.0.1:", port, ": ", strerror(errno)));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (send(socket.fd(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
  }
  std::string answer;
  char buffer[16384];
  while (true) {
    const ssize_t got = recv(socket.fd(), buffer, sizeof(buffer), 0);
    if (got == 0) break;  // HTTP/1.0: the server closes after the body.
    if (got < 0) return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
    answer.append(buffer, static_cast<size_t>(got));
  }
  const size_t body = answer.find("\r\n\r\n");
  if (!absl::StartsWith(answer, "HTTP/1.") || answer.size() < 12 ||
      answer.compare(9, 3, "200") != 0 || body == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("GET ", path, ": not a 200 answer: ", answer.substr(0, 200)));
  }
  return answer.substr(body + 4);
}

}  // namespace attnserve::testing
