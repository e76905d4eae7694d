#include "core/model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/util/checked_math.h"
#include "core/util/half_float.h"
#include "nlohmann/json.hpp"

namespace attnserve::model {
namespace {

// The format is little-endian and the values are copied as they are in memory.
static_assert(std::endian::native == std::endian::little);

// Insertion-ordered so the header lists tensors in data order, which makes files easy to read.
using OrderedJson = nlohmann::ordered_json;

constexpr size_t kHeaderAlignment = 8;

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status TensorError(const TensorToWrite& tensor, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.name, "\": ", detail));
}

absl::Status CheckTensor(const TensorToWrite& tensor, std::set<std::string>& seen) {
  if (tensor.name.empty()) return absl::InvalidArgumentError("tensor name is empty");
  // The reader would take a tensor called "__metadata__" for the metadata object.
  if (tensor.name == "__metadata__") return TensorError(tensor, "the name is reserved");
  if (!seen.insert(tensor.name).second) return TensorError(tensor, "duplicate name");
  const bool supported = tensor.dtype == TensorDtype::kF32 || tensor.dtype == TensorDtype::kF16 ||
                         tensor.dtype == TensorDtype::kBF16;
  if (!supported) {
    return TensorError(tensor,
                       absl::StrCat("cannot write dtype ", AbslView(DtypeName(tensor.dtype)),
                                    "; expected F32, F16 or BF16"));
  }
  const std::string shape_text = absl::StrCat("[", absl::StrJoin(tensor.shape, ", "), "]");
  for (int64_t dim : tensor.shape) {
    if (dim < 0) {
      return TensorError(tensor, absl::StrCat("shape ", shape_text, " has a negative dimension"));
    }
  }
  // Counted as the reader counts (CheckedProduct): a zero dimension makes the tensor empty
  // whatever the others are, so [2^32, 2^32, 0], which the reader accepts, is writable too
  // (a running product overflowed on its first two dimensions and refused it).
  const std::optional<int64_t> elements = CheckedProduct(tensor.shape);
  if (!elements.has_value()) {
    return TensorError(tensor, absl::StrCat("shape ", shape_text, " is too large"));
  }
  if (static_cast<uint64_t>(*elements) != tensor.values.size()) {
    return TensorError(tensor, absl::StrCat("shape ", shape_text, " has ", *elements,
                                            " elements, values has ", tensor.values.size()));
  }
  return absl::OkStatus();
}

// Appends `values` encoded as `dtype` (F32, F16 or BF16), little-endian.
void AppendValues(std::span<const float> values, TensorDtype dtype, std::string& out) {
  if (dtype == TensorDtype::kF32) {
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    return;
  }
  const size_t start = out.size();
  out.resize(start + values.size() * sizeof(uint16_t));
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits =
        dtype == TensorDtype::kF16 ? FloatToHalf(values[i]) : FloatToBFloat16(values[i]);
    std::memcpy(out.data() + start + i * sizeof(bits), &bits, sizeof(bits));
  }
}

absl::StatusOr<std::string> HeaderJson(std::span<const TensorToWrite> tensors,
                                       const std::map<std::string, std::string>& metadata) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    const uint64_t bytes = tensor.values.size() * static_cast<uint64_t>(DtypeSize(tensor.dtype));
    header[tensor.name] = {{"dtype", std::string(DtypeName(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  try {
    return header.dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() rejects strings that are not UTF-8; the format requires UTF-8 JSON.
    return absl::InvalidArgumentError(
        absl::StrCat("tensor names and metadata must be valid UTF-8: ", e.what()));
  }
}

absl::Status ErrnoError(const std::filesystem::path& path, absl::string_view what, int error) {
  return absl::InternalError(
      absl::StrCat(path.string(), ": ", what, ": ", std::generic_category().message(error)));
}

// Writes all of `contents`, retrying short writes and interrupted calls.
bool WriteAll(int fd, std::string_view contents) {
  while (!contents.empty()) {
    const ssize_t written = write(fd, contents.data(), contents.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    contents.remove_prefix(static_cast<size_t>(written));
  }
  return true;
}

// Writes, flushes and closes `fd`; `path` names it in errors. Closes `fd` in every case.
absl::Status WriteAndSync(int fd, const std::filesystem::path& path, std::string_view contents) {
  absl::Status status;
  if (!WriteAll(fd, contents)) {
    status = ErrnoError(path, "cannot write", errno);
  } else if (fsync(fd) != 0) {
    status = ErrnoError(path, "cannot fsync", errno);
  }
  // close() can report a deferred write error (e.g. on NFS), so its result matters too.
  if (close(fd) != 0 && status.ok()) status = ErrnoError(path, "cannot close", errno);
  return status;
}

// Makes the rename itself durable. Best effort: readers already see the new file, and a failure
// here (some file systems cannot fsync a directory) leaves nothing for the caller to undo.
void SyncDirectory(const std::filesystem::path& folder) {
  const int fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

}  // namespace

absl::StatusOr<std::string> SerializeSafetensors(
    std::span<const TensorToWrite> tensors, const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const TensorToWrite& tensor : tensors) {
    if (auto s = CheckTensor(tensor, seen); !s.ok()) return s;
  }
  auto header = HeaderJson(tensors, metadata);
  if (!header.ok()) return header.status();
  // Spaces are JSON whitespace, so padding keeps the header valid while aligning the data
  // section (which starts at 8 + header size) to 8 bytes.
  header->append((kHeaderAlignment - header->size() % kHeaderAlignment) % kHeaderAlignment, ' ');

  const uint64_t header_size = header->size();
  std::string image(sizeof(header_size), '\0');
  std::memcpy(image.data(), &header_size, sizeof(header_size));
  image += *header;
  for (const TensorToWrite& tensor : tensors) AppendValues(tensor.values, tensor.dtype, image);
  return image;
}

absl::Status WriteFileAtomically(const std::filesystem::path& path, std::string_view contents) {
  // Unique within this process (counter) and across processes (pid), so concurrent writers of
  // the same file never share a temporary.
  static std::atomic<uint64_t> counter{0};
  std::filesystem::path temp = path;
  temp += absl::StrCat(".tmp.", getpid(), ".", counter.fetch_add(1));

  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(temp, "cannot create", errno);
  absl::Status status = WriteAndSync(fd, temp, contents);
  if (status.ok() && rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;  // Before StrCat, which may allocate.
    status = ErrnoError(path, absl::StrCat("cannot rename ", temp.string(), " to it"), error);
  }
  if (!status.ok()) {
    unlink(temp.c_str());
    return status;
  }
  SyncDirectory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
  return absl::OkStatus();
}

}  // namespace attnserve::model
