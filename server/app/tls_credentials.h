// The gRPC port's transport security: plaintext, TLS, or mutual TLS, built from TlsOptions as the
// server credentials every service on the port shares (they apply at the ServerBuilder's
// listening port, so the health, reflection and every attnserve service are covered alike).
//
// Certificates are read by gRPC's FileWatcherCertificateProvider from VerifiedTlsFiles' private
// copy, which follows the operator's files once a new set passes the OpenSSL check: replacing them
// (a Kubernetes Secret update swaps a symlinked folder atomically; a `cp` works too) rotates the
// server's certificate or the trusted client CA without a restart, and connections already open
// keep the certificate they were made with.
//
// Thread-safety: a free function; no state.
#ifndef ATTNSERVE_SERVER_APP_TLS_CREDENTIALS_H_
#define ATTNSERVE_SERVER_APP_TLS_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace attnserve::server {

struct TlsOptions {
  // PEM certificate chain (the server's certificate first) and its PEM private key. Both empty:
  // plaintext. One without the other is an error.
  std::string cert_chain_path = {};
  std::string private_key_path = {};
  // PEM bundle of the CAs whose client certificates are accepted. Non-empty turns on mutual TLS:
  // a client without a certificate signed by one of them is refused during the handshake.
  // Requires the two above.
  std::string client_ca_path = {};
  // Seconds between checks of the files for changes (VerifiedTlsFiles). >= 1.
  int64_t refresh_interval_s = 10;
};

// Whether `options` asks for TLS (a certificate chain or key is set).
bool TlsEnabled(const TlsOptions& options);

// OK when `options` is plaintext or a complete TLS configuration; InvalidArgument naming the
// option when only one of chain and key is set, a client CA comes without them, or
// refresh_interval_s < 1. The files' contents are VerifiedTlsFiles' to check.
absl::Status ValidateTlsOptions(const TlsOptions& options);

class VerifiedTlsFiles;

// Insecure credentials when `files` is null; otherwise TLS (mutual when it has a client CA)
// credentials whose certificates follow `files`, which must outlive them and the server using
// them.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const VerifiedTlsFiles* files);

// One line for the startup log: "plaintext", "TLS (cert ..., key ...)" or "mutual TLS (...)".
std::string DescribeTls(const TlsOptions& options);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_TLS_CREDENTIALS_H_
