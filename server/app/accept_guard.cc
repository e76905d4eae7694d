#include "server/app/accept_guard.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

using Accept4Fn = int (*)(int, sockaddr*, socklen_t*, int);

std::atomic<Accept4Fn> accept_for_testing{nullptr};

// The accept4 this one hides: libc's (or a sanitizer's interceptor, which then calls libc's).
Accept4Fn NextAccept4() {
  static const Accept4Fn next = reinterpret_cast<Accept4Fn>(dlsym(RTLD_NEXT, "accept4"));
  const Accept4Fn replaced = accept_for_testing.load(std::memory_order_relaxed);
  return replaced != nullptr ? replaced : next;
}

std::atomic<bool> armed{false};
std::atomic<int64_t> shed_total{0};
std::atomic<int64_t> last_warning_ms{0};

std::mutex spare_mu;
int spare_fd = -1;  // Guarded by spare_mu: /dev/null, closed only to make room for one accept.

int OpenSpare() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

// Set while the spare descriptor is lost: another thread took the number it freed. Every accept4
// then tries to get it back (one failed open() while the process is still at its limit).
std::atomic<bool> spare_lost{false};

void ReopenSpareLocked() {
  if (spare_fd < 0) spare_fd = OpenSpare();
  spare_lost.store(spare_fd < 0, std::memory_order_relaxed);
}

// Accepts and closes every connection waiting on `listener`, each through the spare descriptor,
// until the backlog is empty (accept4 fails with EAGAIN, or anything but a connection that was
// aborted while waiting) or the spare is lost to another thread that took the freed number.
// Returns how many were shed.
int64_t ShedWaitingConnections(int listener) {
  std::lock_guard<std::mutex> lock(spare_mu);
  ReopenSpareLocked();
  int64_t shed = 0;
  while (spare_fd >= 0) {
    close(spare_fd);
    spare_fd = -1;
    const int connection = NextAccept4()(listener, nullptr, nullptr, SOCK_CLOEXEC);
    const int error = errno;
    if (connection >= 0) {
      close(connection);
      ++shed;
    }
    ReopenSpareLocked();
    // A client that gave up while queued leaves ECONNABORTED; the ones behind it still wait.
    if (connection < 0 && error != ECONNABORTED && error != EINTR) break;
  }
  return shed;
}

void WarnAtMostOncePerSecond(int error, int64_t shed) {
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  int64_t last = last_warning_ms.load(std::memory_order_relaxed);
  if (now_ms - last < 1000 ||
      !last_warning_ms.compare_exchange_strong(last, now_ms, std::memory_order_relaxed)) {
    return;
  }
  spdlog::warn(
      "accept: out of file descriptors ({}): shed {} waiting connection(s), {} in all; the "
      "listener keeps accepting. Raise the open-file limit (ulimit -n) or add replicas",
      std::strerror(error), shed, shed_total.load(std::memory_order_relaxed));
}

}  // namespace

absl::Status ArmAcceptGuard() {
  std::lock_guard<std::mutex> lock(spare_mu);
  ReopenSpareLocked();
  if (spare_fd < 0) {
    return absl::InternalError(
        absl::StrCat("accept guard: cannot open /dev/null as a spare file "
                     "descriptor: ",
                     std::strerror(errno)));
  }
  armed.store(true, std::memory_order_release);
  return absl::OkStatus();
}

int64_t ConnectionsShedAtFileLimit() { return shed_total.load(std::memory_order_relaxed); }

void SetWrappedAccept4ForTesting(Accept4Function accept) {
  accept_for_testing.store(accept, std::memory_order_relaxed);
}

}  // namespace attnserve::server

// Replaces libc's accept4 for the whole process (the executable's definition comes first in the
// dynamic linker's lookup; the attnserve_server target exports it). gRPC's listener calls it.
extern "C" int accept4(int listener, sockaddr* address, socklen_t* length, int flags) {
  using namespace attnserve::server;  // NOLINT: the extern "C" entry point into this file.
  const int connection = NextAccept4()(listener, address, length, flags);
  if (!armed.load(std::memory_order_acquire)) return connection;
  const int error = errno;
  if (spare_lost.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(spare_mu);
    ReopenSpareLocked();
  }
  if (connection >= 0 || (error != EMFILE && error != ENFILE)) {
    errno = error;  // The reopen may have set it.
    return connection;
  }
  const int64_t shed = ShedWaitingConnections(listener);
  shed_total.fetch_add(shed, std::memory_order_relaxed);
  WarnAtMostOncePerSecond(error, shed);
  errno = EAGAIN;  // gRPC re-arms its listener on EAGAIN, and closes it on anything else.
  return -1;
}
