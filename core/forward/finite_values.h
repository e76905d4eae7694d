// FindNonFinite: locating NaN and ±∞ in float arrays, fast enough to run on every request.
// Pure function; thread-safe.
#ifndef ATTNSERVE_CORE_FORWARD_FINITE_VALUES_H_
#define ATTNSERVE_CORE_FORWARD_FINITE_VALUES_H_

#include <cstdint>
#include <span>

namespace attnserve::core {

// Index of the first NaN or ±∞ in `values`, or -1 if every value is finite. Scans in blocks with
// a branch-free test on the exponent bits, so the common all-finite case vectorises.
int64_t FindNonFinite(std::span<const float> values);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_FINITE_VALUES_H_
