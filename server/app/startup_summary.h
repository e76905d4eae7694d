// The startup summary the attnserve binary logs once it listens: address, models (shape,
// parameters, batching limits), oneDNN version and ISA, and the thread budget.
#ifndef ATTNSERVE_SERVER_APP_STARTUP_SUMMARY_H_
#define ATTNSERVE_SERVER_APP_STARTUP_SUMMARY_H_

#include "server/app/server.h"
#include "server/app/server_options.h"

namespace attnserve::server {

void LogStartupSummary(Server& server, const ServerOptions& options);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_STARTUP_SUMMARY_H_
