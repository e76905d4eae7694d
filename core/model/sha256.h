// SHA-256 of model files, for config.json's optional "weights_sha256" (model_config.h): the
// digest of the exact bytes a load parses, spelled as `sha256sum` prints it, so a checksum can be
// produced or checked with standard tools. Computed with OpenSSL's libcrypto (EVP), a private
// dependency of attnserve_model. Pure functions; thread-safe.
#ifndef ATTNSERVE_CORE_MODEL_SHA256_H_
#define ATTNSERVE_CORE_MODEL_SHA256_H_

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace attnserve::model {

// Hex digits in a SHA-256 digest.
inline constexpr size_t kSha256HexLength = 64;

// The SHA-256 of `bytes` as 64 lowercase hex digits. Internal when libcrypto fails (it does not
// for SHA-256 short of running out of memory; the caller still gets a status, not a crash).
absl::StatusOr<std::string> Sha256Hex(std::span<const std::byte> bytes);
absl::StatusOr<std::string> Sha256Hex(std::string_view bytes);

// Whether `text` is 64 hex digits (either case): the shape of a SHA-256 digest.
bool IsSha256Hex(std::string_view text);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_SHA256_H_
