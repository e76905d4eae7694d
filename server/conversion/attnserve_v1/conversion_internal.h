// Helpers shared by the two halves of conversion.h's implementation (conversion_request.cc,
// conversion_response.cc). Internal to server/.
#ifndef ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_INTERNAL_H_
#define ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_INTERNAL_H_

#include <bit>
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve::server::conversion_internal {

// Tensor.raw is little-endian float32, copied with memcpy; a big-endian host would need swaps.
static_assert(std::endian::native == std::endian::little);

inline constexpr int64_t kFloatBytes = sizeof(float);

template <typename... Pieces>
absl::Status Invalid(const Pieces&... pieces) {
  return absl::InvalidArgumentError(absl::StrCat(pieces...));
}

template <typename... Pieces>
absl::Status Internal(const Pieces&... pieces) {
  return absl::InternalError(absl::StrCat(pieces...));
}

}  // namespace attnserve::server::conversion_internal

#endif  // ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_INTERNAL_H_
