// RepositoryPoller: a background thread that calls ModelRepository::Poll() at a fixed interval,
// so that model folders added, changed or removed on disk are loaded, reloaded or unloaded without
// a restart.
//
// Thread-safe to destroy from any thread but the callback's; the destructor stops the thread
// (waiting for a poll in progress to finish). The repository must outlive the poller.
#ifndef ATTNSERVE_SERVER_REPOSITORY_REPOSITORY_POLLER_H_
#define ATTNSERVE_SERVER_REPOSITORY_REPOSITORY_POLLER_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "core/util/notification.h"
#include "server/repository/model_repository.h"

namespace attnserve::repository {

struct RepositoryPollerOptions {
  // Time between the end of one poll and the start of the next. Must be > 0. Default 5 s.
  int64_t poll_interval_ms = 5000;
};

class RepositoryPoller {
 public:
  // Called on the poller's thread after every poll that changed something (non-empty events) or
  // whose scan status (ModelRepository::scan_status) differs from the previous poll's; `scan` is
  // that status. Used to log and count. Must not destroy the poller.
  using EventCallback =
      std::function<void(const std::vector<ModelEvent>& events, const absl::Status& scan)>;

  // Starts polling `repository` (borrowed). The first poll happens one interval from now.
  RepositoryPoller(ModelRepository& repository, const RepositoryPollerOptions& options,
                   EventCallback on_events);
  ~RepositoryPoller();

  RepositoryPoller(const RepositoryPoller&) = delete;
  RepositoryPoller& operator=(const RepositoryPoller&) = delete;

 private:
  void Run();

  ModelRepository& repository_;
  const RepositoryPollerOptions options_;
  const EventCallback on_events_;
  Notification stop_;
  absl::Status last_scan_;  // Only touched by the poller's thread.
  std::thread thread_;      // Last: starts after every other member is ready.
};

}  // namespace attnserve::repository

#endif  // ATTNSERVE_SERVER_REPOSITORY_REPOSITORY_POLLER_H_
