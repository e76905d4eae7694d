// The leaf certificate of a PEM chain as an operator's log needs it (names, issuer, validity), and
// the one line that describes it. Used where the server logs which certificate it now serves.
//
// Thread-safety: free functions; no state.
#ifndef ATTNSERVE_SERVER_APP_CERTIFICATE_SUMMARY_H_
#define ATTNSERVE_SERVER_APP_CERTIFICATE_SUMMARY_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnserve::server {

// The first certificate of a PEM file (a chain's leaf), as far as a log needs it.
struct CertificateSummary {
  std::string subject;  // "CN=localhost"
  std::string issuer;   // "CN=attnserve-test-ca"
  std::string names;    // subjectAltName: "DNS:localhost, IP:127.0.0.1"; "" when none
  absl::Time not_before;
  absl::Time not_after;
};

// The first certificate of `pem`; InvalidArgument when it holds no PEM certificate.
absl::StatusOr<CertificateSummary> SummarizeCertificate(std::string_view pem);

// "subject CN=localhost, names DNS:localhost, issuer CN=ca, valid 2026-11-30T23:00:00Z to ..."
// followed by "; EXPIRED" or "; NOT YET VALID" when `now` is outside the validity.
std::string DescribeCertificate(const CertificateSummary& summary, absl::Time now);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_CERTIFICATE_SUMMARY_H_
