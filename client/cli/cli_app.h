// attnserve-cli's command line: parses the arguments with CLI11, connects with the client
// library and runs one subcommand (models, info, health, attend, bench, ghz-data).
//
// RunCli is the whole program but for the process: main() passes argv and the standard streams,
// tests pass their own streams and run it in-process. CLI11's parse errors are caught here and
// printed (no exception leaves RunCli). Thread-safe only in the sense that calls share nothing.
#ifndef ATTNSERVE_CLIENT_CLI_CLI_APP_H_
#define ATTNSERVE_CLIENT_CLI_CLI_APP_H_

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace attnserve::cli {

// `args` excludes the program name. Returns the exit status: 0 on success (for health: the
// service is SERVING; for bench: no request failed), 1 on failure with "error: ..." on `err`,
// CLI11's status for usage errors (and 0 for --help and --version, printed on `out`).
// `git_revision` is what --version reports beside the release (main() passes the build's).
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           std::string_view git_revision = "unknown");

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_CLI_APP_H_
