// Owning handles for the OpenSSL objects the TLS file checks and the certificate log use, so that
// every early return frees what was parsed.
//
// Thread-safety: plain unique_ptrs; one owner each.
#ifndef ATTNSERVE_SERVER_APP_OPENSSL_HANDLES_H_
#define ATTNSERVE_SERVER_APP_OPENSSL_HANDLES_H_

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>
#include <string_view>

namespace attnserve::server {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct PrivateKeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Certificate = std::unique_ptr<X509, X509Free>;
using PrivateKey = std::unique_ptr<EVP_PKEY, PrivateKeyFree>;

// A read-only memory BIO over `pem`, which must outlive it.
inline Bio ReadOnlyBio(std::string_view pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_OPENSSL_HANDLES_H_
