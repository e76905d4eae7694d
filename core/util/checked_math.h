// CheckedProduct: a product of sizes that reports overflow instead of wrapping.
//
// Used wherever sizes come from outside (a request's shape, a safetensors header) before
// anything is multiplied or allocated. Pure functions; thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_CHECKED_MATH_H_
#define ATTNSERVE_CORE_UTIL_CHECKED_MATH_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>

namespace attnserve {

// The product of `factors` (each >= 0), or nullopt when it does not fit in int64_t. A zero factor
// makes the product zero whatever the others are (so {huge, huge, 0} is 0, not an overflow).
inline std::optional<int64_t> CheckedProduct(std::span<const int64_t> factors) {
  if (std::find(factors.begin(), factors.end(), 0) != factors.end()) return 0;
  int64_t product = 1;
  for (int64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product)) return std::nullopt;
  }
  return product;
}

inline std::optional<int64_t> CheckedProduct(std::initializer_list<int64_t> factors) {
  return CheckedProduct(std::span<const int64_t>(factors.begin(), factors.size()));
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_CHECKED_MATH_H_
