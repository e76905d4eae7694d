// attnserve-cli: a command line for attnserve servers. Run with --help.
#include <grpc/grpc.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "attnserve/git_revision.h"
#include "client/cli/cli_app.h"
#include "core/util/reuse_large_allocations.h"

int main(int argc, char** argv) {
  attnserve::ReuseLargeAllocations();
  // As the server: no lock-order cycle check on every absl::Mutex acquisition (Debian's abseil
  // makes it; 1.2 % of the client's CPU in a 64-session decode bench, in GraphCycles).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Holds gRPC's library reference for the whole process, so that the last channel's destructor
  // does not run grpc_shutdown(), which can wait up to 10 s on an executor thread's epoll (gRPC
  // 1.51; seen as a 10 s stall at exit). A health check must return at once.
  grpc_init();
  const std::vector<std::string> args(argv + 1, argv + argc);
  return attnserve::cli::RunCli(args, std::cout, std::cerr, ATTNSERVE_GIT_REVISION);
}
