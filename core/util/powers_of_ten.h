// Powers of ten as the JSON number reader and writer (json_numbers.h, float_to_text.h) need them:
// as doubles, 10^-64 to 10^63, each the double nearest to it (exact from 10^0 to 10^22), and as
// integers, 10^0 to 10^9.
//
// Header-only constants; thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_POWERS_OF_TEN_H_
#define ATTNSERVE_CORE_UTIL_POWERS_OF_TEN_H_

#include <cstdint>

namespace attnserve {
namespace powers_of_ten_internal {

inline constexpr double kDoubles[] = {
    1e-64, 1e-63, 1e-62, 1e-61, 1e-60, 1e-59, 1e-58, 1e-57, 1e-56, 1e-55, 1e-54, 1e-53, 1e-52,
    1e-51, 1e-50, 1e-49, 1e-48, 1e-47, 1e-46, 1e-45, 1e-44, 1e-43, 1e-42, 1e-41, 1e-40, 1e-39,
    1e-38, 1e-37, 1e-36, 1e-35, 1e-34, 1e-33, 1e-32, 1e-31, 1e-30, 1e-29, 1e-28, 1e-27, 1e-26,
    1e-25, 1e-24, 1e-23, 1e-22, 1e-21, 1e-20, 1e-19, 1e-18, 1e-17, 1e-16, 1e-15, 1e-14, 1e-13,
    1e-12, 1e-11, 1e-10, 1e-9,  1e-8,  1e-7,  1e-6,  1e-5,  1e-4,  1e-3,  1e-2,  1e-1,  1e0,
    1e1,   1e2,   1e3,   1e4,   1e5,   1e6,   1e7,   1e8,   1e9,   1e10,  1e11,  1e12,  1e13,
    1e14,  1e15,  1e16,  1e17,  1e18,  1e19,  1e20,  1e21,  1e22,  1e23,  1e24,  1e25,  1e26,
    1e27,  1e28,  1e29,  1e30,  1e31,  1e32,  1e33,  1e34,  1e35,  1e36,  1e37,  1e38,  1e39,
    1e40,  1e41,  1e42,  1e43,  1e44,  1e45,  1e46,  1e47,  1e48,  1e49,  1e50,  1e51,  1e52,
    1e53,  1e54,  1e55,  1e56,  1e57,  1e58,  1e59,  1e60,  1e61,  1e62,  1e63};

}  // namespace powers_of_ten_internal

// 10^p for p in [-64, 63]: the nearest double, exact for p in [0, 22].
inline constexpr double PowerOfTen(int p) { return powers_of_ten_internal::kDoubles[p + 64]; }

// 10^n for n in [0, 9].
inline constexpr uint64_t kIntegerPowersOfTen[] = {
    1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_POWERS_OF_TEN_H_
