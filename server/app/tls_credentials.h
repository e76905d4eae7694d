// The gRPC port's transport security: plaintext, TLS, or mutual TLS, built from TlsOptions as the
// server credentials every service on the port shares (they apply at the ServerBuilder's
// listening port, so the health, reflection and every attnserve service are covered alike).
//
// Certificates are read by gRPC's FileWatcherCertificateProvider, which re-reads the files every
// refresh interval: replacing them (a Kubernetes Secret update swaps a symlinked folder
// atomically) rotates the server's certificate or the trusted client CA without a restart, and
// connections already open keep the certificate they were made with.
//
// Thread-safety: a free function; no state.
#ifndef ATTNSERVE_SERVER_APP_TLS_CREDENTIALS_H_
#define ATTNSERVE_SERVER_APP_TLS_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

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
  // Seconds between checks of the files for changes (gRPC's file watcher). >= 1.
  int64_t refresh_interval_s = 10;
};

// Whether `options` asks for TLS (a certificate chain or key is set).
bool TlsEnabled(const TlsOptions& options);

// Insecure credentials when TLS is off; otherwise TLS (mutual when client_ca_path is set)
// credentials whose certificates follow the files. InvalidArgument naming the option when only one
// of chain and key is set, a client CA comes without them, or refresh_interval_s < 1; NotFound /
// FailedPrecondition naming the file when one cannot be read or holds no PEM block of the expected
// kind (gRPC itself would only log and refuse every handshake).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options);

// One line for the startup log: "plaintext", "TLS (cert ..., key ...)" or "mutual TLS (...)".
std::string DescribeTls(const TlsOptions& options);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_TLS_CREDENTIALS_H_
