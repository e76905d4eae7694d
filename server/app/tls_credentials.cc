#include "server/app/tls_credentials.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "server/app/verified_tls_files.h"

namespace attnserve::server {
namespace {

// How often gRPC re-reads VerifiedTlsFiles' private copy: local files that change only when a
// checked set is published, so reading them often costs nothing and adds at most this delay to a
// rotation.
constexpr unsigned int kCopyRefreshIntervalS = 1;

}  // namespace

bool TlsEnabled(const TlsOptions& options) {
  return !options.cert_chain_path.empty() || !options.private_key_path.empty();
}

absl::Status ValidateTlsOptions(const TlsOptions& options) {
  if (!TlsEnabled(options)) {
    if (!options.client_ca_path.empty()) {
      return absl::InvalidArgumentError(
          "tls_client_ca: mutual TLS needs tls_cert_chain and tls_private_key too");
    }
    return absl::OkStatus();
  }
  if (options.cert_chain_path.empty() || options.private_key_path.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_chain, tls_private_key: expected both set (TLS) or both empty (plaintext)");
  }
  if (options.refresh_interval_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls_refresh_interval_s: expected >= 1, got ", options.refresh_interval_s));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const VerifiedTlsFiles* files) {
  if (files == nullptr) return grpc::InsecureServerCredentials();
  const bool mutual = !files->client_ca_path().empty();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files->private_key_path(), files->cert_chain_path(), files->client_ca_path(),
      kCopyRefreshIntervalS);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (mutual) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

std::string DescribeTls(const TlsOptions& options) {
  if (!TlsEnabled(options)) return "plaintext";
  std::string text = absl::StrCat(options.client_ca_path.empty() ? "TLS" : "mutual TLS", " (cert ",
                                  options.cert_chain_path, ", key ", options.private_key_path);
  if (!options.client_ca_path.empty())
    absl::StrAppend(&text, ", client CA ", options.client_ca_path);
  absl::StrAppend(&text, ", checked every ", options.refresh_interval_s, " s)");
  return text;
}

}  // namespace attnserve::server
