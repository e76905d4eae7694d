#include "server/app/tls_credentials.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attnserve::server {
namespace {

// OK when `path` can be read and holds a PEM block whose label contains `label` ("CERTIFICATE",
// "PRIVATE KEY"); `option` names the flag in the error.
absl::Status CheckPemFile(const std::string& option, const std::string& path,
                          const std::string& label) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat(option, ": cannot read \"", path, "\""));
  }
  std::ostringstream text;
  text << file.rdbuf();
  const std::string contents = text.str();
  if (!absl::StrContains(contents, "-----BEGIN ") || !absl::StrContains(contents, label)) {
    return absl::FailedPreconditionError(
        absl::StrCat(option, ": \"", path, "\" holds no PEM block of a ", label));
  }
  return absl::OkStatus();
}

}  // namespace

bool TlsEnabled(const TlsOptions& options) {
  return !options.cert_chain_path.empty() || !options.private_key_path.empty();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options) {
  if (!TlsEnabled(options)) {
    if (!options.client_ca_path.empty()) {
      return absl::InvalidArgumentError(
          "tls_client_ca: mutual TLS needs tls_cert_chain and tls_private_key too");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.cert_chain_path.empty() || options.private_key_path.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_chain, tls_private_key: expected both set (TLS) or both empty (plaintext)");
  }
  if (options.refresh_interval_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls_refresh_interval_s: expected >= 1, got ", options.refresh_interval_s));
  }
  if (absl::Status status = CheckPemFile("tls_cert_chain", options.cert_chain_path, "CERTIFICATE");
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          CheckPemFile("tls_private_key", options.private_key_path, "PRIVATE KEY");
      !status.ok()) {
    return status;
  }
  const bool mutual = !options.client_ca_path.empty();
  if (mutual) {
    if (absl::Status status = CheckPemFile("tls_client_ca", options.client_ca_path, "CERTIFICATE");
        !status.ok()) {
      return status;
    }
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.private_key_path, options.cert_chain_path, options.client_ca_path,
      static_cast<unsigned int>(options.refresh_interval_s));
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
  absl::StrAppend(&text, ", re-read every ", options.refresh_interval_s, " s)");
  return text;
}

}  // namespace attnserve::server
