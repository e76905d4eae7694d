// ReuseLargeAllocations: makes glibc's malloc keep freed blocks of up to 32 MiB in its heaps, so
// that the next request's tensors and message buffers reuse their pages.
//
// By default glibc maps each block above a threshold on its own (128 KiB at first, raised on the
// fly to the largest mapped block freed so far) and hands the top of a heap back to the system
// once twice that much is free there. A process that allocates and frees a few MiB per message
// then touches fresh pages on every message, and each first touch is a page fault: per 512-row
// Attend call, ~290 in attnserve-cli (2.6 ms of CPU per call with them, 1.6 without), ~440 on a
// server with one batch thread. Fixed thresholds keep the pages for reuse: blocks under 32 MiB
// (glibc's largest mapping threshold) come from the heaps, and a heap's free top is kept up to
// 64 MiB. What a burst leaves free is handed back by malloc_trim(0) (the server's MemoryTrimmer,
// every 10 s by default).
//
// Process-wide. Call once, at the start of main(), before other threads allocate. A no-op where
// malloc is not glibc's (sanitizer builds replace it).
#ifndef ATTNSERVE_CORE_UTIL_REUSE_LARGE_ALLOCATIONS_H_
#define ATTNSERVE_CORE_UTIL_REUSE_LARGE_ALLOCATIONS_H_

#include <malloc.h>

namespace attnserve {

inline void ReuseLargeAllocations() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_UTIL_REUSE_LARGE_ALLOCATIONS_H_
