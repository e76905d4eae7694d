// A small reader and writer of NumPy's .npy files, for attnserve-cli's tensors.
//
// Reads format versions 1.0 and 2.0 (3.0 too: it differs from 2.0 only in the header's text
// encoding), dtype '<f4' (float32) as is and '<f8' (float64) converted to float32, C order only.
// Writes version 1.0, '<f4', C order, the header padded to 64 bytes as NumPy does.
//
// Stateless functions, thread-safe. Failures are InvalidArgument (a malformed file or an
// unsupported dtype or order, named in the message) or NotFound / Internal for I/O, never a crash
// on bad input.
#ifndef ATTNSERVE_CLIENT_CLI_NPY_H_
#define ATTNSERVE_CLIENT_CLI_NPY_H_

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/client/types.h"

namespace attnserve::cli {

// Parses the bytes of a whole .npy file.
absl::StatusOr<client::Tensor> ParseNpy(std::string_view bytes);
// Reads and parses `path`; errors name the file.
absl::StatusOr<client::Tensor> ReadNpy(const std::filesystem::path& path);

// The bytes of a version 1.0 .npy file holding `data` (row-major) with `shape`. `data` must hold
// product(shape) elements (InvalidArgument otherwise).
absl::StatusOr<std::string> SerializeNpy(std::span<const float> data,
                                         std::span<const int64_t> shape);
// Serializes and writes `path` (replacing it).
absl::Status WriteNpy(const std::filesystem::path& path, std::span<const float> data,
                      std::span<const int64_t> shape);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_NPY_H_
