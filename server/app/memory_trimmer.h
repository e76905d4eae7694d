// MemoryTrimmer: hands the allocator's free memory back to the system now and then.
//
// glibc's malloc keeps what a burst freed in its arenas (one per thread that allocated, up to
// 8 × cores): after 48 large requests the server stayed at 1.2–2.6 GiB while idle. Chunks of
// 32 MiB and more are mapped and unmapped on their own, but a request's smaller pieces (tensors of
// a few MiB, protobuf and gRPC buffers) are not. malloc_trim(0) releases the free pages of every
// arena (madvise), so resident memory follows the load back down. It takes each arena's lock for
// as long as it walks it (well under a millisecond on this server's heaps), hence an interval
// rather than after every request.
//
// Thread-safe; owns one thread ("attnserve-trim"), stopped and joined by the destructor.
#ifndef ATTNSERVE_SERVER_APP_MEMORY_TRIMMER_H_
#define ATTNSERVE_SERVER_APP_MEMORY_TRIMMER_H_

#include <thread>

#include "absl/time/time.h"
#include "core/util/notification.h"

namespace attnserve::server {

class MemoryTrimmer {
 public:
  // Trims every `interval` (> 0) until destroyed.
  explicit MemoryTrimmer(absl::Duration interval);
  ~MemoryTrimmer();
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

 private:
  Notification stop_;
  std::thread thread_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_MEMORY_TRIMMER_H_
