// attnserve: the gRPC attention inference server.
//
//   attnserve [--grpc-address 0.0.0.0:50051] [--model-repository models] [--config file.toml] ...
//
// Runs until SIGTERM or SIGINT, then drains (health NOT_SERVING, new requests refused, accepted
// requests answered) within --shutdown-grace-s and exits 0. Exit 1 when it cannot start.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnserve/git_revision.h"
#include "core/util/reuse_large_allocations.h"
#include "server/app/logging.h"
#include "server/app/server.h"
#include "server/app/server_flags.h"
#include "server/app/startup_summary.h"
#include "spdlog/spdlog.h"

namespace {

// libgomp reads its wait policy once, before main. Its default (spin ~300k times, then sleep)
// makes idle compute threads steal the cores the gRPC threads need; sleeping at once costs a
// wake-up between primitives (docs/ARCHITECTURE.md, "Threads"). Unless the user chose,
// re-execute with OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000: spin briefly, then sleep.
void EnsureOpenMpWaitPolicy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  setenv("GOMP_SPINCOUNT", "1000", 1);
  execv("/proc/self/exe", argv);  // Returns only on failure: then run with libgomp's defaults.
}

// Raises the soft limit on open files to the hard limit, and says so: every connection is a file
// descriptor, and when accept() meets EMFILE gRPC 1.51's listener stops accepting for good
// (grpc/grpc#20418), so the default soft limit of 1024 is a cheap way to take the server down.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    spdlog::info("open-file limit raised from {} to {} (the hard limit)", before, limit.rlim_max);
  } else {
    spdlog::warn("open-file limit stays {}: cannot raise it to {}", before, limit.rlim_max);
  }
}

}  // namespace

int main(int argc, char** argv) {
  EnsureOpenMpWaitPolicy(argv);
  attnserve::ReuseLargeAllocations();
  // Debian's abseil checks every absl::Mutex acquisition for lock-order cycles (0.6 % of the
  // server's CPU under load, in GraphCycles); the tests keep that check, the server does not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using attnserve::server::ServerFlags;
  CLI::App app{"attnserve: multi-head attention inference over gRPC, batched on the CPU"};
  ServerFlags flags;
  attnserve::server::AddServerFlags(app, flags);
  app.set_version_flag("--version",
                       [] { return attnserve::server::VersionText(ATTNSERVE_GIT_REVISION); });
  CLI11_PARSE(app, argc, argv);
  attnserve::server::FinishServerFlags(flags);
  flags.server.git_revision = ATTNSERVE_GIT_REVISION;

  if (absl::Status status = attnserve::server::ConfigureLogging(flags.log_level, flags.log_format);
      !status.ok()) {
    std::fprintf(stderr, "attnserve: %s\n", std::string(status.message()).c_str());
    return 1;
  }

  // Block the shutdown signals in every thread (threads inherit the mask), so that only the
  // sigwait below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  RaiseOpenFileLimit();
  absl::StatusOr<std::unique_ptr<attnserve::server::Server>> server =
      attnserve::server::Server::Start(flags.server);
  if (!server.ok()) {
    spdlog::critical("cannot start: {}", server.status().ToString());
    return 1;
  }
  attnserve::server::LogStartupSummary(**server, (*server)->options());

  int received = 0;
  sigwait(&signals, &received);
  spdlog::info("{} received: draining (grace {} s)", received == SIGTERM ? "SIGTERM" : "SIGINT",
               flags.shutdown_grace_s);
  (*server)->Shutdown(absl::Seconds(flags.shutdown_grace_s));
  spdlog::info("drained; exiting");
  server->reset();
  return 0;
}
