#include "core/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

// Closes `fd` on every path out of Open; the mapping does not need it once created.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { close(fd_); }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<MappedFile> MappedFile::Open(const std::filesystem::path& path) {
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
  // mmap rejects a zero length, and an empty file has nothing to map anyway.
  if (size == 0) return MappedFile(nullptr, 0);

  void* data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (data == MAP_FAILED) return ErrnoError(path, "cannot map", errno);
  return MappedFile(static_cast<const std::byte*>(data), size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Unmap(); }

void MappedFile::Unmap() {
  if (data_ != nullptr) munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace attnserve::model
