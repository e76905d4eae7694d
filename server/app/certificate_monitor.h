// CertificateMonitor: logs what the gRPC port's TLS certificate is, at start and whenever its file
// changes, and warns when it is expired or not yet valid.
//
// gRPC's file watcher (tls_credentials.h) swaps certificates silently, and a client that refuses
// the server's certificate (unknown CA, expired, wrong name) does so after the server's half of the
// handshake: the server would log nothing. This log line is what an operator reads instead: the
// names, issuer and validity the server presents (so "wrong host name" and "wrong CA" can be read
// off it) and, for an expired or not yet valid certificate, a warning saying so.
//
// Thread-safe; owns one thread ("attnserve-tls"), stopped and joined by the destructor.
#ifndef ATTNSERVE_SERVER_APP_CERTIFICATE_MONITOR_H_
#define ATTNSERVE_SERVER_APP_CERTIFICATE_MONITOR_H_

#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/util/notification.h"

namespace attnserve::server {

// The first certificate of a PEM file (a chain's leaf), as far as a log needs it.
struct CertificateSummary {
  std::string subject;  // "CN=localhost"
  std::string issuer;   // "CN=attnserve-test-ca"
  std::string names;    // subjectAltName: "DNS:localhost, IP:127.0.0.1"; "" when none
  absl::Time not_before;
  absl::Time not_after;
};

// NotFound when `path` cannot be read; InvalidArgument when it holds no PEM certificate.
absl::StatusOr<CertificateSummary> ReadCertificateSummary(const std::string& path);

// "subject CN=localhost, names DNS:localhost, issuer CN=ca, valid 2026-11-30T23:00:00Z to ..."
// followed by "; EXPIRED" or "; NOT YET VALID" when `now` is outside the validity.
std::string DescribeCertificate(const CertificateSummary& summary, absl::Time now);

class CertificateMonitor {
 public:
  // Logs `path`'s certificate now, then checks the file every `interval` (> 0) until destroyed,
  // logging again when its contents change. Problems (unreadable, expired) are warnings.
  CertificateMonitor(std::string path, absl::Duration interval);
  ~CertificateMonitor();
  CertificateMonitor(const CertificateMonitor&) = delete;
  CertificateMonitor& operator=(const CertificateMonitor&) = delete;

 private:
  // Logs the certificate when the file's contents differ from `*last` (updated).
  void Check(std::string* last) const;

  const std::string path_;
  Notification stop_;
  std::thread thread_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_CERTIFICATE_MONITOR_H_
