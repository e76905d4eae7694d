// OpenMP settings the core's executors share.
//
// kOwnParallelRegions: whether the core's own `#pragma omp parallel` regions use more than one
// thread. Use it in the region's `if` clause (or to size its team).
//
// Under ThreadSanitizer they run on the calling thread only: libgomp is not instrumented, so TSan
// cannot see a region's fork and join and reports every read of the caller's variables inside
// it as a race. oneDNN's own regions live in uninstrumented libdnnl and are unaffected; release
// and ASan builds keep their teams.
#ifndef ATTNSERVE_CORE_UTIL_OPENMP_REGIONS_H_
#define ATTNSERVE_CORE_UTIL_OPENMP_REGIONS_H_

#include <omp.h>

namespace attnserve::core {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kOwnParallelRegions = false;
#else
inline constexpr bool kOwnParallelRegions = true;
#endif

// Sets the calling thread's OpenMP team size (used by oneDNN's regions and ours) for one call
// and restores the caller's setting when destroyed; 0 leaves it alone. Not copyable.
class OpenMpThreadsScope {
 public:
  explicit OpenMpThreadsScope(int threads) : saved_(threads > 0 ? omp_get_max_threads() : 0) {
    if (threads > 0) omp_set_num_threads(threads);
  }
  ~OpenMpThreadsScope() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  OpenMpThreadsScope(const OpenMpThreadsScope&) = delete;
  OpenMpThreadsScope& operator=(const OpenMpThreadsScope&) = delete;

 private:
  int saved_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_OPENMP_REGIONS_H_
