// FileBytes: the whole contents of a file, read into memory the process owns.
//
// Model files are read, not memory-mapped: a mapping of a file that another process truncates or
// rewrites in place (a plain `cp` over it while the poller loads it) faults with SIGBUS on the
// first page past the new end, killing the server. A read sees such a change as a short or long
// read and reports it as an error instead, so the previous model version keeps serving.
//
// Move-only owner of the buffer; bytes() stays valid (at the same address, also across moves)
// until the object is destroyed. Const methods are thread-safe.
#ifndef ATTNSERVE_CORE_MODEL_FILE_BYTES_H_
#define ATTNSERVE_CORE_MODEL_FILE_BYTES_H_

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <utility>

#include "absl/status/statusor.h"

namespace attnserve::model {

class FileBytes {
 public:
  // Reads `path` (symlinks followed). NotFound when it does not exist; FailedPrecondition when it
  // is not a regular file; Aborted when its size changed while it was read (it is being
  // rewritten: retry once the writer is done, and replace files by rename); InvalidArgument for
  // other open/stat/read failures (e.g. a symlink loop); ResourceExhausted when the buffer cannot
  // be allocated. Every message starts with the path and gives the reason. An empty file reads as
  // an empty span.
  static absl::StatusOr<FileBytes> Open(const std::filesystem::path& path);

  // A moved-from FileBytes is empty.
  FileBytes(FileBytes&& other) noexcept
      : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  FileBytes& operator=(FileBytes&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes() = default;

  std::span<const std::byte> bytes() const { return {data_.get(), size_}; }

 private:
  FileBytes(std::unique_ptr<std::byte[]> data, size_t size) : data_(std::move(data)), size_(size) {}

  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_FILE_BYTES_H_
