#include "server/repository/repository_poller.h"

#include <algorithm>
#include <utility>

#include "absl/time/time.h"

namespace attnserve::repository {

RepositoryPoller::RepositoryPoller(ModelRepository& repository,
                                   const RepositoryPollerOptions& options, EventCallback on_events)
    : repository_(repository),
      options_(options),
      on_events_(std::move(on_events)),
      thread_([this] { Run(); }) {}

RepositoryPoller::~RepositoryPoller() {
  stop_.Notify();
  thread_.join();
}

void RepositoryPoller::Run() {
  const absl::Duration interval =
      absl::Milliseconds(std::max<int64_t>(1, options_.poll_interval_ms));
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    std::vector<ModelEvent> events = repository_.Poll();
    absl::Status scan = repository_.scan_status();
    const bool scan_changed = scan != last_scan_;
    last_scan_ = scan;
    if ((!events.empty() || scan_changed) && on_events_) on_events_(events, scan);
  }
}

}  // namespace attnserve::repository
