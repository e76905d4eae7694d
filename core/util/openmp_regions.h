// kOwnParallelRegions: whether the core's own `#pragma omp parallel` regions use more than one
// thread. Use it in the region's `if` clause (or to size its team).
//
// Under ThreadSanitizer they run on the calling thread only: libgomp is not instrumented, so TSan
// cannot see a region's fork and join and reports every read of the caller's variables inside
// it as a race. oneDNN's own regions live in uninstrumented libdnnl and are unaffected; release
// and ASan builds keep their teams.
#ifndef ATTNSERVE_CORE_UTIL_OPENMP_REGIONS_H_
#define ATTNSERVE_CORE_UTIL_OPENMP_REGIONS_H_

namespace attnserve::core {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kOwnParallelRegions = false;
#else
inline constexpr bool kOwnParallelRegions = true;
#endif

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_OPENMP_REGIONS_H_
