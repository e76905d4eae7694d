#include "server/http/https_certificates.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace attnserve::server::http {

struct HttpsCertificates::KeyPair {
  X509* leaf = nullptr;
  STACK_OF(X509) * chain = nullptr;  // The intermediates after the leaf.
  EVP_PKEY* key = nullptr;
  ~KeyPair() {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

namespace {

absl::Status Unreadable(const char* option, const std::string& path, const char* what) {
  ERR_clear_error();
  return absl::InvalidArgumentError(
      absl::StrCat(option, ": expected ", what, " in \"", path, "\", got none"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<HttpsCertificates::KeyPair>> HttpsCertificates::ReadPair(
    const HttpsFiles& files) {
  auto pair = std::make_shared<KeyPair>();
  BIO* chain = BIO_new_file(files.cert_chain_path.c_str(), "r");
  if (chain == nullptr) {
    return Unreadable("tls_cert_chain", files.cert_chain_path, "a readable PEM file");
  }
  pair->leaf = PEM_read_bio_X509(chain, nullptr, nullptr, nullptr);
  pair->chain = sk_X509_new_null();
  while (X509* next = PEM_read_bio_X509(chain, nullptr, nullptr, nullptr)) {
    sk_X509_push(pair->chain, next);
  }
  BIO_free(chain);
  ERR_clear_error();  // The end of the file reads as an error.
  if (pair->leaf == nullptr) {
    return Unreadable("tls_cert_chain", files.cert_chain_path, "a PEM certificate");
  }
  BIO* key = BIO_new_file(files.private_key_path.c_str(), "r");
  if (key == nullptr) {
    return Unreadable("tls_private_key", files.private_key_path, "a readable PEM file");
  }
  pair->key = PEM_read_bio_PrivateKey(key, nullptr, nullptr, nullptr);
  BIO_free(key);
  if (pair->key == nullptr) {
    return Unreadable("tls_private_key", files.private_key_path, "a PEM private key");
  }
  if (X509_check_private_key(pair->leaf, pair->key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "tls_private_key: expected the key of the certificate in \"", files.cert_chain_path,
        "\", got another key in \"", files.private_key_path, "\""));
  }
  return pair;
}

absl::StatusOr<std::unique_ptr<HttpsCertificates>> HttpsCertificates::Load(
    const HttpsFiles& files) {
  std::unique_ptr<HttpsCertificates> certificates(new HttpsCertificates(files));
  const int64_t generation = files.generation ? files.generation() : 0;
  auto pair = ReadPair(files);
  if (!pair.ok()) return pair.status();
  certificates->pair_ = *std::move(pair);
  certificates->generation_ = generation;
  return certificates;
}

HttpsCertificates::~HttpsCertificates() = default;

std::shared_ptr<const HttpsCertificates::KeyPair> HttpsCertificates::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t generation = files_.generation ? files_.generation() : 0;
  if (generation == generation_) return pair_;
  auto pair = ReadPair(files_);
  // Read during a swap, the files can be of two sets: keep the last pair and try again at the
  // next handshake (the generation is only taken once a pair was read whole).
  if (pair.ok() && (files_.generation ? files_.generation() : 0) == generation) {
    pair_ = *std::move(pair);
    generation_ = generation;
    spdlog::info("HTTPS: serving the certificate of TLS file set {}", generation);
  }
  return pair_;
}

int HttpsCertificates::SelectCertificate(SSL* ssl, void* self) {
  std::shared_ptr<const KeyPair> pair = static_cast<HttpsCertificates*>(self)->Current();
  // Override: replaces whatever the context had; OpenSSL takes its own references.
  return SSL_use_cert_and_key(ssl, pair->leaf, pair->key, pair->chain, 1) == 1 ? 1 : 0;
}

bool HttpsCertificates::Configure(SSL_CTX* ctx) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(ctx, &HttpsCertificates::SelectCertificate, this);
  if (files_.client_ca_path.empty()) return true;
  STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files_.client_ca_path.c_str());
  if (names == nullptr ||
      SSL_CTX_load_verify_locations(ctx, files_.client_ca_path.c_str(), nullptr) != 1) {
    sk_X509_NAME_pop_free(names, X509_NAME_free);
    ERR_clear_error();
    spdlog::error("HTTPS: cannot read the client CAs in {}", files_.client_ca_path);
    return false;
  }
  SSL_CTX_set_client_CA_list(ctx, names);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return true;
}

}  // namespace attnserve::server::http
