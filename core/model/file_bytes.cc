#include "core/model/file_bytes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve::model {
namespace {

absl::Status ErrnoError(const std::filesystem::path& path, const char* what, int error) {
  std::string message =
      absl::StrCat(path.string(), ": ", what, ": ", std::generic_category().message(error));
  // ENOTDIR: a component of the path is a file, so the path does not exist either.
  if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(message);
  return absl::InvalidArgumentError(message);
}

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes `fd` on every path out of Open.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { close(fd_); }

 private:
  int fd_;
};

// Reads up to `size` bytes into `out`, retrying interrupted and partial reads; returns how many
// were read (fewer at end of file), or -1 with errno set.
ssize_t ReadFully(int fd, std::byte* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t got = read(fd, out + done, size - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return static_cast<ssize_t>(done);
}

absl::Status Changed(const std::filesystem::path& path, size_t expected, const char* how) {
  return absl::AbortedError(absl::StrCat(
      path.string(), ": the file ", how, " while it was read (", expected,
      " bytes when opened): it is being rewritten; replace model files by writing a new file and "
      "renaming it into place"));
}

}  // namespace

absl::StatusOr<FileBytes> FileBytes::Open(const std::filesystem::path& path) {
  // O_NONBLOCK keeps a FIFO from blocking open() until a writer appears (it is then rejected as
  // not a regular file); it has no effect on regular files.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(path, "cannot open", errno);
  FdCloser closer(fd);

  struct stat info;
  if (fstat(fd, &info) != 0) return ErrnoError(path, "cannot stat", errno);
  if (!S_ISREG(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path.string(), ": is ", FileTypeName(info.st_mode), ", not a regular file"));
  }
  const auto size = static_cast<size_t>(info.st_size);
  std::unique_ptr<std::byte[]> data(new (std::nothrow) std::byte[size == 0 ? 1 : size]);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path.string(), ": cannot allocate ", size, " bytes to read it"));
  }
  const ssize_t got = ReadFully(fd, data.get(), size);
  if (got < 0) return ErrnoError(path, "cannot read", errno);
  if (static_cast<size_t>(got) < size) return Changed(path, size, "shrank");
  std::byte extra;
  const ssize_t more = ReadFully(fd, &extra, 1);
  if (more < 0) return ErrnoError(path, "cannot read", errno);
  if (more > 0) return Changed(path, size, "grew");
  return FileBytes(std::move(data), size);
}

}  // namespace attnserve::model
