// Happens-before edges that gRPC's callback API guarantees, made visible to ThreadSanitizer.
// Used by the server's reactors and the client library's (no gRPC type is needed here).
//
// gRPC runs each reaction (OnReadDone, OnWriteDone, OnDone, ...) after the operation that
// started it (StartRead, StartWrite, Finish) and OnDone after everything else. Debian's libgrpc
// is not instrumented, so TSan cannot see that ordering, and every reactor member written before
// a Start*/Finish call and read in the matching reaction (or freed after OnDone) would be
// reported as a race. Calling HandOff(token) just before the operation and TakeOver(token) first
// thing in its reaction states the ordering gRPC promises, for that one operation only: a member
// touched after the hand-off is still checked. Outside TSan builds both compile to nothing.
//
// Thread-safe; `token` is any address that identifies the operation (e.g. a reactor member).
#ifndef ATTNSERVE_CORE_UTIL_HAPPENS_BEFORE_H_
#define ATTNSERVE_CORE_UTIL_HAPPENS_BEFORE_H_

#include "absl/base/config.h"

#ifdef ABSL_HAVE_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace attnserve {

// Everything this thread did so far happens before a later TakeOver(token).
inline void HandOff([[maybe_unused]] const void* token) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_release(const_cast<void*>(token));
#endif
}

// Everything done before every earlier HandOff(token) happens before what this thread does next.
inline void TakeOver([[maybe_unused]] const void* token) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_acquire(const_cast<void*>(token));
#endif
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_HAPPENS_BEFORE_H_
