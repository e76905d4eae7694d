#include "core/model/sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace attnserve::model {

absl::StatusOr<std::string> Sha256Hex(std::span<const std::byte> bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_length = 0;
  // The one-shot EVP_Digest: the weights are already whole in memory (FileBytes), so there is
  // nothing to stream, and it covers every length in one call.
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &digest_length, EVP_sha256(), nullptr) != 1 ||
      digest_length * 2 != kSha256HexLength) {
    const unsigned long error = ERR_get_error();
    char reason[256] = "no reason given";
    if (error != 0) ERR_error_string_n(error, reason, sizeof(reason));
    ERR_clear_error();
    return absl::InternalError(
        absl::StrCat("SHA-256 of ", bytes.size(), " bytes failed in libcrypto: ", reason));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(kSha256HexLength, '0');
  for (unsigned int i = 0; i < digest_length; ++i) {
    hex[2 * i] = kHex[digest[i] >> 4];
    hex[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return hex;
}

absl::StatusOr<std::string> Sha256Hex(std::string_view bytes) {
  return Sha256Hex(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
}

bool IsSha256Hex(std::string_view text) {
  if (text.size() != kSha256HexLength) return false;
  for (char c : text) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace attnserve::model
