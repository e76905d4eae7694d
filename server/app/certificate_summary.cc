#include "server/app/certificate_summary.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/app/openssl_handles.h"

namespace attnserve::server {
namespace {

struct NamesFree {
  void operator()(GENERAL_NAMES* names) const { GENERAL_NAMES_free(names); }
};

// "CN=localhost,O=x" (RFC 2253 order).
std::string NameText(const X509_NAME* name) {
  Bio bio(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::Time AsTime(const ASN1_TIME* time) {
  std::tm parts{};
  if (ASN1_TIME_to_tm(time, &parts) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&parts));
}

// subjectAltName's DNS names and IP addresses, as "DNS:a, IP:1.2.3.4".
std::string AltNames(X509* cert) {
  std::unique_ptr<GENERAL_NAMES, NamesFree> names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  if (names == nullptr) return "";
  std::vector<std::string> parts;
  for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type == GEN_DNS) {
      const ASN1_STRING* dns = name->d.dNSName;
      parts.push_back(absl::StrCat(
          "DNS:", std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                              static_cast<size_t>(ASN1_STRING_length(dns)))));
    } else if (name->type == GEN_IPADD && name->d.iPAddress->length == 4) {
      const unsigned char* ip = name->d.iPAddress->data;
      parts.push_back(absl::StrCat("IP:", ip[0], ".", ip[1], ".", ip[2], ".", ip[3]));
    } else if (name->type == GEN_IPADD) {
      parts.push_back("IP:(IPv6)");
    }
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace

absl::StatusOr<CertificateSummary> SummarizeCertificate(std::string_view pem) {
  Bio bio = ReadOnlyBio(pem);
  Certificate cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError("no PEM certificate");
  }
  return CertificateSummary{.subject = NameText(X509_get_subject_name(cert.get())),
                            .issuer = NameText(X509_get_issuer_name(cert.get())),
                            .names = AltNames(cert.get()),
                            .not_before = AsTime(X509_get0_notBefore(cert.get())),
                            .not_after = AsTime(X509_get0_notAfter(cert.get()))};
}

std::string DescribeCertificate(const CertificateSummary& summary, absl::Time now) {
  const char* kFormat = "%Y-%m-%dT%H:%M:%SZ";
  std::string text =
      absl::StrCat("subject ", summary.subject, ", names ",
                   summary.names.empty() ? "(none)" : summary.names, ", issuer ", summary.issuer,
                   ", valid ", absl::FormatTime(kFormat, summary.not_before, absl::UTCTimeZone()),
                   " to ", absl::FormatTime(kFormat, summary.not_after, absl::UTCTimeZone()));
  if (now > summary.not_after) {
    absl::StrAppend(&text, "; EXPIRED: clients refuse it (certificate verify failed)");
  } else if (now < summary.not_before) {
    absl::StrAppend(&text, "; NOT YET VALID: clients refuse it (certificate verify failed)");
  }
  return text;
}

}  // namespace attnserve::server
