// TlsFileSet: the contents of the gRPC port's TLS files (certificate chain, private key, client CA
// bundle), and the OpenSSL check a set must pass before gRPC may see it.
//
// gRPC asserts (aborting the process) on an empty chain or key, and serves a garbage or mismatched
// pair by failing every handshake; a file caught half-written by a `cp` is any of those. The check
// accepts exactly what gRPC can serve: every PEM block parses, the key belongs to the chain's
// first certificate, and a client CA bundle (mutual TLS) holds at least one certificate.
//
// Thread-safety: a value type and free functions; no state.
#ifndef ATTNSERVE_SERVER_APP_TLS_FILE_SET_H_
#define ATTNSERVE_SERVER_APP_TLS_FILE_SET_H_

#include <string>

#include "absl/status/status.h"

namespace attnserve::server {

// Which file of the set a problem is in; also the `file` label of the failure metric.
enum class TlsFile { kCertChain, kPrivateKey, kClientCa };

// "tls_cert_chain", "tls_private_key", "tls_client_ca": the option that names the file.
const char* TlsFileOption(TlsFile file);
// "cert_chain", "private_key", "client_ca": the failure metric's `file` label.
const char* TlsFileLabel(TlsFile file);

struct TlsFileSet {
  std::string cert_chain;   // PEM, the server's certificate first
  std::string private_key;  // PEM
  std::string client_ca;    // PEM; empty when mutual TLS is off
  bool operator==(const TlsFileSet&) const = default;
};

// OK when gRPC can serve `set`; otherwise InvalidArgument whose message starts with the option
// of the offending file (`*bad`, when not null), e.g. "tls_private_key: does not match the
// certificate chain's first certificate". `mutual` requires a client CA bundle.
absl::Status CheckTlsFileSet(const TlsFileSet& set, bool mutual, TlsFile* bad = nullptr);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_TLS_FILE_SET_H_
