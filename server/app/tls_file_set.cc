#include "server/app/tls_file_set.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/app/openssl_handles.h"

namespace attnserve::server {
namespace {

size_t CountOf(std::string_view text, std::string_view needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string_view::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// Every certificate of a PEM bundle, or an error naming what is wrong. A bundle cut short inside
// a block (a `cp` caught half-way) has a BEGIN line more than it has certificates.
absl::Status ParseCertificates(std::string_view pem, std::vector<Certificate>* certificates) {
  if (pem.empty()) return absl::InvalidArgumentError("is empty");
  auto bio = ReadOnlyBio(pem);
  while (true) {
    Certificate certificate(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (certificate == nullptr) break;
    certificates->push_back(std::move(certificate));
  }
  ERR_clear_error();  // The loop ends with "no start line"; nothing to keep.
  if (certificates->empty()) {
    return absl::InvalidArgumentError("holds no PEM certificate (expected BEGIN CERTIFICATE)");
  }
  const size_t blocks = CountOf(pem, "-----BEGIN ");
  if (blocks != certificates->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("holds ", blocks, " PEM blocks of which ", certificates->size(),
                     " parse as certificates (expected every block a whole certificate)"));
  }
  return absl::OkStatus();
}

absl::Status Bad(TlsFile file, TlsFile* bad, const absl::Status& status) {
  if (bad != nullptr) *bad = file;
  return absl::InvalidArgumentError(absl::StrCat(TlsFileOption(file), ": ", status.message()));
}

}  // namespace

const char* TlsFileOption(TlsFile file) {
  switch (file) {
    case TlsFile::kCertChain:
      return "tls_cert_chain";
    case TlsFile::kPrivateKey:
      return "tls_private_key";
    case TlsFile::kClientCa:
      return "tls_client_ca";
  }
  return "tls";
}

const char* TlsFileLabel(TlsFile file) {
  return TlsFileOption(file) + 4;  // The option without its "tls_".
}

absl::Status CheckTlsFileSet(const TlsFileSet& set, bool mutual, TlsFile* bad) {
  std::vector<Certificate> chain;
  if (absl::Status status = ParseCertificates(set.cert_chain, &chain); !status.ok()) {
    return Bad(TlsFile::kCertChain, bad, status);
  }
  if (set.private_key.empty()) {
    return Bad(TlsFile::kPrivateKey, bad, absl::InvalidArgumentError("is empty"));
  }
  auto bio = ReadOnlyBio(set.private_key);
  PrivateKey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, const_cast<char*>("")));
  ERR_clear_error();
  if (key == nullptr) {
    return Bad(TlsFile::kPrivateKey, bad,
               absl::InvalidArgumentError(
                   "holds no readable PEM private key (expected an unencrypted PRIVATE KEY)"));
  }
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return Bad(TlsFile::kPrivateKey, bad,
               absl::InvalidArgumentError(
                   "does not match the certificate chain's first certificate (expected the "
                   "key the certificate was issued for)"));
  }
  if (mutual) {
    std::vector<Certificate> authorities;
    if (absl::Status status = ParseCertificates(set.client_ca, &authorities); !status.ok()) {
      return Bad(TlsFile::kClientCa, bad, status);
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
