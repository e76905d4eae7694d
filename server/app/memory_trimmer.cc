#include "server/app/memory_trimmer.h"

#include <malloc.h>
#include <pthread.h>

namespace attnserve::server {

MemoryTrimmer::MemoryTrimmer(absl::Duration interval)
    : thread_([this, interval] {
        while (!stop_.WaitForNotificationWithTimeout(interval)) malloc_trim(0);
      }) {
  pthread_setname_np(thread_.native_handle(), "attnserve-trim");
}

MemoryTrimmer::~MemoryTrimmer() {
  stop_.Notify();
  thread_.join();
}

}  // namespace attnserve::server
