// Writing safetensors files: used by attnserve-models to generate models and by tests to build
// valid and deliberately broken files.
#ifndef ATTNSERVE_CORE_MODEL_SAFETENSORS_WRITER_H_
#define ATTNSERVE_CORE_MODEL_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/safetensors_file.h"

namespace attnserve::model {

// One tensor to write: fp32 values stored as `dtype` (F32, F16 or BF16; 16-bit formats round to
// nearest even). values.size() must equal the product of shape.
struct TensorToWrite {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  std::span<const float> values;
};

// The complete file image: tensors laid out back to back in the given order, header JSON padded
// with spaces to a multiple of 8 bytes (as the reference implementation does). InvalidArgument
// naming the tensor for a size mismatch, an unsupported dtype, or a duplicate or empty name.
absl::StatusOr<std::string> SerializeSafetensors(
    std::span<const TensorToWrite> tensors, const std::map<std::string, std::string>& metadata);

// Writes `contents` to `path` atomically: a temporary file in the same folder, fsync, rename.
// Readers see the old file or the new one, never a partial one. Internal with the system's reason
// on failure (the temporary file is removed).
absl::Status WriteFileAtomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_SAFETENSORS_WRITER_H_
