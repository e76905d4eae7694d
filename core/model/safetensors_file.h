// Reading safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length N, N bytes of UTF-8 JSON, then the tensor data.
//
// The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section), plus an optional "__metadata__" object of string values.
// ParseSafetensors checks everything before anything is read: the header length fits the file
// and the 100 MB cap, the JSON is one object with well-formed entries and no duplicate names,
// dtypes are names from the format, shape × dtype size == end − begin, every range lies inside the
// data section, ranges do not overlap, and together they cover the data section exactly (no gaps,
// no trailing garbage). Errors are InvalidArgument naming the tensor and the expected and actual
// value.
#ifndef ATTNSERVE_CORE_MODEL_SAFETENSORS_FILE_H_
#define ATTNSERVE_CORE_MODEL_SAFETENSORS_FILE_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/file_bytes.h"

namespace attnserve::model {

// Every dtype the safetensors format defines.
enum class TensorDtype {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64
};

// The format's spelling: "BOOL", "U8", ..., "F8_E5M2", "F16", "BF16", "F32", "F64", ...
std::string_view DtypeName(TensorDtype dtype);
// Parses DtypeName()'s output; InvalidArgument naming the accepted names otherwise.
absl::StatusOr<TensorDtype> ParseDtype(std::string_view name);
// Bytes per element.
int64_t DtypeSize(TensorDtype dtype);

// "[4, 4]": how every message shows a shape ("[]" for a scalar).
std::string FormatShape(std::span<const int64_t> shape);

// One tensor of a parsed file. `bytes` borrows the file image (little-endian, row-major).
struct TensorView {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;

  // Product of shape: 1 for a scalar, 0 when any dimension is 0 whatever the others are (a
  // parsed [2^32, 2^32, 0] is empty). Always exact for a view from ParseSafetensors; a view built
  // by hand whose product overflows gets INT64_MAX.
  int64_t num_elements() const;
};

// The validated index of a safetensors image. Borrows the image: keep it alive while in use.
struct SafetensorsIndex {
  std::vector<TensorView> tensors;  // In data-offset order.
  std::map<std::string, std::string> metadata;

  // The tensor called `name`, or null.
  const TensorView* Find(std::string_view name) const;
};

// Validates `image` (a whole file) as described above.
absl::StatusOr<SafetensorsIndex> ParseSafetensors(std::span<const std::byte> image);

// A read and validated safetensors file. Move-only; thread-safe for const use.
class SafetensorsFile {
 public:
  // Reads and parses `path`. Errors are FileBytes::Open's, or InvalidArgument from
  // ParseSafetensors; every message starts with the path.
  static absl::StatusOr<SafetensorsFile> Open(const std::filesystem::path& path);
  // Parses `file`, already read from `path` (which only names it in messages): for a caller that
  // must examine the very bytes parsed first, e.g. to verify their checksum. InvalidArgument from
  // ParseSafetensors, starting with the path.
  static absl::StatusOr<SafetensorsFile> Parse(std::filesystem::path path, FileBytes file);

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsIndex& index() const { return index_; }

 private:
  SafetensorsFile(std::filesystem::path path, FileBytes file, SafetensorsIndex index)
      : path_(std::move(path)), file_(std::move(file)), index_(std::move(index)) {}

  std::filesystem::path path_;
  FileBytes file_;  // Owns the bytes index_ borrows; moving it keeps them at the same address.
  SafetensorsIndex index_;
};

// The tensor's values as fp32, converted from F32, F16 or BF16 (exactly: every F16/BF16 value is
// representable). InvalidArgument naming the tensor and its dtype for any other dtype. Does not
// check finiteness.
absl::StatusOr<std::vector<float>> ReadFloat32(const TensorView& tensor);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_SAFETENSORS_FILE_H_
