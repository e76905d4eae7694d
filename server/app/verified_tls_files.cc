#include "server/app/verified_tls_files.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/app/certificate_summary.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

namespace fs = std::filesystem;

constexpr char kCurrent[] = "current";
constexpr char kCertChainName[] = "cert_chain.pem";
constexpr char kPrivateKeyName[] = "private_key.pem";
constexpr char kClientCaName[] = "client_ca.pem";

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_ino == b.st_ino && a.st_dev == b.st_dev && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

// `path`'s contents. NotFound (naming `option`) when it cannot be read; Unavailable when it
// changed while being read, as a `cp` in progress does: the next check reads it again.
absl::StatusOr<std::string> ReadSettled(const char* option, const std::string& path) {
  struct stat before {};
  if (stat(path.c_str(), &before) != 0) {
    return absl::NotFoundError(
        absl::StrCat(option, ": cannot read \"", path, "\": ", std::strerror(errno)));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat(option, ": cannot read \"", path, "\": ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << file.rdbuf();
  std::string contents = std::move(text).str();
  struct stat after {};
  if (stat(path.c_str(), &after) != 0 || !SameFile(before, after) ||
      static_cast<off_t>(contents.size()) != after.st_size) {
    return absl::UnavailableError(absl::StrCat(option, ": \"", path, "\" changed while read"));
  }
  return contents;
}

struct FileRef {
  TlsFile file;
  const std::string* path;
  std::string* contents;
};

// Reads every file of the set; on failure `*bad` names the file.
absl::Status ReadSet(const TlsOptions& options, TlsFileSet* set, TlsFile* bad) {
  std::vector<FileRef> files = {
      {TlsFile::kCertChain, &options.cert_chain_path, &set->cert_chain},
      {TlsFile::kPrivateKey, &options.private_key_path, &set->private_key}};
  if (!options.client_ca_path.empty()) {
    files.push_back({TlsFile::kClientCa, &options.client_ca_path, &set->client_ca});
  }
  for (const FileRef& ref : files) {
    absl::StatusOr<std::string> contents = ReadSettled(TlsFileOption(ref.file), *ref.path);
    if (!contents.ok()) {
      *bad = ref.file;
      return contents.status();
    }
    *ref.contents = *std::move(contents);
  }
  return absl::OkStatus();
}

const std::string& PathOf(const TlsOptions& options, TlsFile file) {
  switch (file) {
    case TlsFile::kPrivateKey:
      return options.private_key_path;
    case TlsFile::kClientCa:
      return options.client_ca_path;
    case TlsFile::kCertChain:
      break;
  }
  return options.cert_chain_path;
}

// Writes `contents` to a new file `path` (mode 0600) with modification time `mtime_s`.
absl::Status WriteNewFile(const fs::path& path, const std::string& contents, int64_t mtime_s) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create \"", path.string(), "\": ", std::strerror(errno)));
  }
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const struct timespec times[2] = {{.tv_sec = mtime_s, .tv_nsec = 0},
                                    {.tv_sec = mtime_s, .tv_nsec = 0}};
  const bool ok = written == contents.size() && futimens(fd, times) == 0;
  const int error = errno;
  close(fd);
  if (!ok) {
    return absl::InternalError(
        absl::StrCat("cannot write \"", path.string(), "\": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

void LogServing(const std::string& path, const std::string& cert_chain, bool first) {
  absl::StatusOr<CertificateSummary> summary = SummarizeCertificate(cert_chain);
  if (!summary.ok()) return;  // CheckTlsFileSet parsed it: unreachable.
  const absl::Time now = absl::Now();
  const bool valid = now >= summary->not_before && now <= summary->not_after;
  spdlog::log(valid ? spdlog::level::info : spdlog::level::warn, "TLS certificate {} {}: {}", path,
              first ? "serving" : "changed, now serving", DescribeCertificate(*summary, now));
}

// A new 0700 folder for the copies. $TMPDIR when set; otherwise /dev/shm first, because it is
// memory (a private key never lands on a disk) and stays writable in a container whose root
// filesystem is read-only (Kubernetes' readOnlyRootFilesystem, `docker run --read-only`), and
// /tmp when there is no /dev/shm.
absl::StatusOr<fs::path> MakePrivateFolder() {
  std::vector<fs::path> parents;
  if (const char* tmpdir = std::getenv("TMPDIR"); tmpdir != nullptr && *tmpdir != '\0') {
    parents.emplace_back(tmpdir);
  } else {
    parents = {"/dev/shm", "/tmp"};
  }
  std::string tried;
  for (const fs::path& parent : parents) {
    std::string folder = (parent / "attnserve-tls-XXXXXX").string();
    if (mkdtemp(folder.data()) != nullptr) return fs::path(folder);
    absl::StrAppend(&tried, tried.empty() ? "" : ", ", "\"", parent.string(),
                    "\": ", std::strerror(errno));
  }
  return absl::InternalError(
      absl::StrCat("tls: cannot create the private folder for the checked copy of the TLS files (",
                   tried, "); set TMPDIR to a writable folder, e.g. an emptyDir volume"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<VerifiedTlsFiles>> VerifiedTlsFiles::Start(
    const TlsOptions& options, FailureCounter count_failure) {
  TlsFileSet set;
  TlsFile bad = TlsFile::kCertChain;
  absl::Status read = ReadSet(options, &set, &bad);
  // A file caught mid-write: read again a few times before giving up.
  for (int attempt = 0; absl::IsUnavailable(read) && attempt < 20; ++attempt) {
    absl::SleepFor(absl::Milliseconds(50));
    read = ReadSet(options, &set, &bad);
  }
  if (!read.ok()) return read;
  if (absl::Status check = CheckTlsFileSet(set, !options.client_ca_path.empty(), &bad);
      !check.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(check.message(), " (file \"", PathOf(options, bad), "\")"));
  }
  absl::StatusOr<fs::path> folder = MakePrivateFolder();
  if (!folder.ok()) return folder.status();
  std::unique_ptr<VerifiedTlsFiles> files(
      new VerifiedTlsFiles(options, *std::move(folder), std::move(count_failure)));
  {
    std::lock_guard<std::mutex> lock(files->mu_);
    if (absl::Status status = files->Publish(set); !status.ok()) return status;
  }
  LogServing(options.cert_chain_path, set.cert_chain, /*first=*/true);
  VerifiedTlsFiles* self = files.get();
  files->thread_ = std::thread([self] {
    const absl::Duration interval = absl::Seconds(self->options_.refresh_interval_s);
    while (!self->stop_.WaitForNotificationWithTimeout(interval)) self->CheckNow();
  });
  pthread_setname_np(files->thread_.native_handle(), "attnserve-tls");
  return files;
}

VerifiedTlsFiles::VerifiedTlsFiles(const TlsOptions& options, fs::path folder,
                                   FailureCounter count_failure)
    : options_(options), folder_(std::move(folder)), count_failure_(std::move(count_failure)) {}

VerifiedTlsFiles::~VerifiedTlsFiles() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  std::error_code ignored;
  fs::remove_all(folder_, ignored);
}

std::string VerifiedTlsFiles::cert_chain_path() const {
  return (folder_ / kCurrent / kCertChainName).string();
}
std::string VerifiedTlsFiles::private_key_path() const {
  return (folder_ / kCurrent / kPrivateKeyName).string();
}
std::string VerifiedTlsFiles::client_ca_path() const {
  if (options_.client_ca_path.empty()) return "";
  return (folder_ / kCurrent / kClientCaName).string();
}

int64_t VerifiedTlsFiles::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

int64_t VerifiedTlsFiles::reported_failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reported_failures_;
}

void VerifiedTlsFiles::CheckNow() {
  std::lock_guard<std::mutex> lock(mu_);
  TlsFileSet set;
  TlsFile bad = TlsFile::kCertChain;
  absl::Status status = ReadSet(options_, &set, &bad);
  if (absl::IsUnavailable(status)) return;  // Being written: the next check reads it again.
  if (status.ok() && set == published_) {
    if (!reported_problem_.empty()) {
      spdlog::info("TLS files readable and valid again; the set in use is unchanged");
    }
    pending_problem_.clear();
    reported_problem_.clear();
    return;
  }
  if (status.ok()) {
    status = CheckTlsFileSet(set, !options_.client_ca_path.empty(), &bad);
    if (!status.ok()) {
      status = absl::InvalidArgumentError(
          absl::StrCat(status.message(), " (file \"", PathOf(options_, bad), "\")"));
    }
  }
  if (!status.ok()) {
    Reject(status, bad);
    return;
  }
  if (absl::Status published = Publish(set); !published.ok()) {
    spdlog::error("TLS files: cannot publish the new set, the last good set keeps serving: {}",
                  published.ToString());
    return;
  }
  pending_problem_.clear();
  reported_problem_.clear();
  LogServing(options_.cert_chain_path, set.cert_chain, /*first=*/false);
}

void VerifiedTlsFiles::Reject(const absl::Status& status, TlsFile file) {
  const std::string problem(status.message());
  if (problem == reported_problem_) return;
  if (problem != pending_problem_) {
    pending_problem_ = problem;  // Reported if the next check still finds it.
    return;
  }
  reported_problem_ = problem;
  ++reported_failures_;
  spdlog::warn("TLS files rejected, the last good set keeps serving: {}", problem);
  if (count_failure_) count_failure_(file);
}

absl::Status VerifiedTlsFiles::Publish(const TlsFileSet& set) {
  const int64_t generation = generation_ + 1;
  // Strictly increasing, in whole seconds: gRPC's watcher compares time_t modification times.
  const int64_t mtime_s = std::max(absl::ToUnixSeconds(absl::Now()), last_mtime_s_ + 1);
  const std::string name = absl::StrCat("set-", generation);
  const fs::path dir = folder_ / name;
  if (mkdir(dir.c_str(), 0700) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot create \"", dir.string(), "\": ", std::strerror(errno)));
  }
  std::vector<std::pair<const char*, const std::string*>> files = {
      {kCertChainName, &set.cert_chain}, {kPrivateKeyName, &set.private_key}};
  if (!options_.client_ca_path.empty()) files.emplace_back(kClientCaName, &set.client_ca);
  for (const auto& [file, contents] : files) {
    if (absl::Status status = WriteNewFile(dir / file, *contents, mtime_s); !status.ok()) {
      return status;
    }
  }
  const fs::path link = folder_ / "current.new";
  std::error_code error;
  fs::remove(link, error);
  fs::create_directory_symlink(name, link, error);
  if (!error) fs::rename(link, folder_ / kCurrent, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot switch \"", (folder_ / kCurrent).string(),
                                            "\" to ", name, ": ", error.message()));
  }
  // The set before stays: gRPC's watcher may be reading it at this moment.
  fs::remove_all(folder_ / absl::StrCat("set-", generation - 2), error);
  generation_ = generation;
  last_mtime_s_ = mtime_s;
  published_ = set;
  return absl::OkStatus();
}

}  // namespace attnserve::server
