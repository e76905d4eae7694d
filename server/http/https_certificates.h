// HttpsCertificates: the certificate, chain and key an HTTPS port serves, read from files that
// are replaced only by complete, checked sets (VerifiedTlsFiles' private copy) and re-read when
// their generation changes, so that a rotated certificate is served from the next handshake on
// without a restart. The client CA of mutual TLS is read once, at Load.
//
// Thread-safe: handshakes on any number of threads call it at once.
#ifndef ATTNSERVE_SERVER_HTTP_HTTPS_CERTIFICATES_H_
#define ATTNSERVE_SERVER_HTTP_HTTPS_CERTIFICATES_H_

#include <openssl/ssl.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "server/http/http_server.h"

namespace attnserve::server::http {

class HttpsCertificates {
 public:
  // Reads the files now. InvalidArgument naming the file when one cannot be read or parsed.
  static absl::StatusOr<std::unique_ptr<HttpsCertificates>> Load(const HttpsFiles& files);
  ~HttpsCertificates();
  HttpsCertificates(const HttpsCertificates&) = delete;
  HttpsCertificates& operator=(const HttpsCertificates&) = delete;

  // Sets `ctx` up to serve these certificates: TLS 1.2 or later, the certificate chosen at each
  // handshake, and client verification with mutual TLS. False if OpenSSL refuses (logged).
  bool Configure(SSL_CTX* ctx);

 private:
  struct KeyPair;
  explicit HttpsCertificates(HttpsFiles files) : files_(std::move(files)) {}
  // The pair of the files' current generation (re-read when it changed; the last good one if
  // the new one cannot be read).
  std::shared_ptr<const KeyPair> Current();
  // Reads the chain and the key, and checks that they belong together.
  static absl::StatusOr<std::shared_ptr<KeyPair>> ReadPair(const HttpsFiles& files);
  // OpenSSL's certificate callback: installs Current() on `ssl`.
  static int SelectCertificate(SSL* ssl, void* self);

  const HttpsFiles files_;
  std::mutex mu_;
  std::shared_ptr<const KeyPair> pair_;  // Guarded by mu_.
  int64_t generation_ = -1;              // Guarded by mu_.
};

}  // namespace attnserve::server::http

#endif  // ATTNSERVE_SERVER_HTTP_HTTPS_CERTIFICATES_H_
