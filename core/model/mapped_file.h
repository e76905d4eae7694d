// MappedFile: a read-only memory mapping of a whole file.
//
// Move-only RAII owner of the mapping; bytes() stays valid until the object is destroyed. Const
// methods are thread-safe. The mapping is private and read-only: if another process truncates
// the file while it is mapped, reading past the new end raises SIGBUS, so writers must replace
// model files atomically (write elsewhere, then rename), as attnserve's own tools do.
#ifndef ATTNSERVE_CORE_MODEL_MAPPED_FILE_H_
#define ATTNSERVE_CORE_MODEL_MAPPED_FILE_H_

#include <cstddef>
#include <filesystem>
#include <span>

#include "absl/status/statusor.h"

namespace attnserve::model {

class MappedFile {
 public:
  // Maps `path` (symlinks followed). NotFound when it does not exist; FailedPrecondition when it
  // is not a regular file; InvalidArgument for other open/stat/mmap failures (e.g. a symlink
  // loop). Every message starts with the path and gives the system's reason. An empty file maps
  // to an empty span.
  static absl::StatusOr<MappedFile> Open(const std::filesystem::path& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  MappedFile(const std::byte* data, size_t size) : data_(data), size_(size) {}
  void Unmap();

  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_MAPPED_FILE_H_
