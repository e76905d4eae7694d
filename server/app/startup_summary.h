// What the attnserve binary says about itself: the startup summary it logs once it listens
// (release and revision, address, models with shape, parameters and batching limits, oneDNN
// version and ISA, the thread budget) and the text of `attnserve --version`.
#ifndef ATTNSERVE_SERVER_APP_STARTUP_SUMMARY_H_
#define ATTNSERVE_SERVER_APP_STARTUP_SUMMARY_H_

#include <string>
#include <string_view>

#include "server/app/server.h"
#include "server/app/server_options.h"

namespace attnserve::server {

void LogStartupSummary(Server& server, const ServerOptions& options);

// `attnserve --version`: the release and `git_revision`, then the oneDNN version with the ISA it
// runs on this machine, then the gRPC version, one per line. Cannot fail.
std::string VersionText(std::string_view git_revision);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_STARTUP_SUMMARY_H_
