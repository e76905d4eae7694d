// The accept guard: keeps gRPC 1.51's listener alive when the process runs out of file
// descriptors.
//
// When accept4() fails with EMFILE or ENFILE, gRPC 1.51 logs "Failed accept4" and closes its
// listening socket for good (grpc/grpc#20418, fixed upstream in later releases by retrying): one
// moment at the open-file limit, reached by opening connections, would leave a server that serves
// its open connections but never accepts another. The guard wraps accept4() for the whole process
// (accept_guard.cc defines it, ahead of libc's in symbol lookup): on EMFILE/ENFILE it sheds the
// waiting connections (closes each at once, through one spare descriptor kept for that), logs a
// warning at most once a second, and reports EAGAIN, so gRPC waits for the next connection
// instead of giving up. Shed clients see their connection close and reconnect with backoff.
// Every other accept4() result passes through untouched.
//
// Remove it with the move to a gRPC that retries accept on EMFILE itself.
#ifndef ATTNSERVE_SERVER_APP_ACCEPT_GUARD_H_
#define ATTNSERVE_SERVER_APP_ACCEPT_GUARD_H_

#include <sys/socket.h>

#include <cstdint>

#include "absl/status/status.h"

namespace attnserve::server {

// Arms the guard: reserves the spare descriptor used to shed connections. Until armed, accept4()
// passes everything through. Idempotent and thread-safe. Internal (with the system's reason) when
// no descriptor can be reserved; the server then runs unguarded.
absl::Status ArmAcceptGuard();

// Connections accepted and closed at once because the process was out of file descriptors,
// since the process started. Thread-safe.
int64_t ConnectionsShedAtFileLimit();

// For tests: the accept4 the guard wraps (null: the next one, libc's), to play the kernel's
// answers. Set before any accept4 call that should see it; not synchronised with them.
using Accept4Function = int (*)(int listener, sockaddr* address, socklen_t* length, int flags);
void SetWrappedAccept4ForTesting(Accept4Function accept);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_ACCEPT_GUARD_H_
