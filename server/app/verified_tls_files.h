// VerifiedTlsFiles: the operator's TLS files (certificate chain, private key, client CA), checked
// with OpenSSL before gRPC reads them.
//
// gRPC's file watcher reads whatever the files hold and aborts the process on an empty chain or
// key; `cp new.pem server.pem` passes through exactly that (the file is truncated, then written).
// So gRPC never reads the operator's files: it reads a private copy that only ever holds a set
// that passed CheckTlsFileSet. Every refresh interval the operator's files are read (skipping a
// file that changes while it is read) and checked; a set that passes is published, one that fails
// leaves the last good set serving, and once it has failed two checks in a row (a rotation that
// replaces the certificate before the key passes through one mismatched check) it is logged as a
// warning and counted, once per episode.
//
// The copy is published as a folder per set behind a symlink swapped atomically (a Kubernetes
// Secret's layout) with strictly increasing modification times, so gRPC's watcher, which reads
// key and chain one after the other and re-reads when a modification time changed meanwhile,
// always reads a key and a chain of the same set.
//
// Thread-safe; owns one thread ("attnserve-tls") and the private folder (mode 0700, under
// $TMPDIR when set, else /dev/shm, else /tmp), both gone when destroyed.
#ifndef ATTNSERVE_SERVER_APP_VERIFIED_TLS_FILES_H_
#define ATTNSERVE_SERVER_APP_VERIFIED_TLS_FILES_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "core/util/notification.h"
#include "server/app/tls_credentials.h"
#include "server/app/tls_file_set.h"

namespace attnserve::server {

class VerifiedTlsFiles {
 public:
  // Called on the watcher thread once per reported failure episode, with the offending file.
  using FailureCounter = std::function<void(TlsFile)>;

  // Reads and checks the files `options` names (TlsEnabled, ValidateTlsOptions OK), publishes
  // them, and checks again every options.refresh_interval_s until destroyed. Errors: NotFound
  // naming the option and path when a file cannot be read; InvalidArgument from CheckTlsFileSet
  // (with the path) when the set cannot be served; Internal when the private folder cannot be
  // written. `count_failure` may be null.
  static absl::StatusOr<std::unique_ptr<VerifiedTlsFiles>> Start(const TlsOptions& options,
                                                                 FailureCounter count_failure);
  ~VerifiedTlsFiles();
  VerifiedTlsFiles(const VerifiedTlsFiles&) = delete;
  VerifiedTlsFiles& operator=(const VerifiedTlsFiles&) = delete;

  // The files gRPC's watcher reads; each always holds a checked set. client_ca_path() is empty
  // without mutual TLS.
  std::string cert_chain_path() const;
  std::string private_key_path() const;
  std::string client_ca_path() const;

  // One check of the operator's files now, as the thread does every refresh interval (tests call
  // it to avoid waiting).
  void CheckNow();
  // Sets published so far: 1 after Start, +1 per accepted change.
  int64_t generation() const;
  // Failure episodes reported so far (what count_failure was called for).
  int64_t reported_failures() const;

 private:
  VerifiedTlsFiles(const TlsOptions& options, std::filesystem::path folder,
                   FailureCounter count_failure);
  absl::Status Publish(const TlsFileSet& set) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reject(const absl::Status& status, TlsFile file) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TlsOptions options_;
  const std::filesystem::path folder_;
  const FailureCounter count_failure_;
  mutable std::mutex mu_;
  TlsFileSet published_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_mtime_s_ ABSL_GUARDED_BY(mu_) = 0;
  // The problem seen at the last check (reported once seen twice) and the one reported.
  std::string pending_problem_ ABSL_GUARDED_BY(mu_);
  std::string reported_problem_ ABSL_GUARDED_BY(mu_);
  int64_t reported_failures_ ABSL_GUARDED_BY(mu_) = 0;
  Notification stop_;
  std::thread thread_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_VERIFIED_TLS_FILES_H_
