// The fixture of the attnserve-cli subcommand tests: a live in-process server on 127.0.0.1
// (ServerTest's models) and attnserve-cli run in-process against it through RunCli.
#ifndef ATTNSERVE_TESTS_CLIENT_CLI_CLI_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_CLIENT_CLI_CLI_TEST_SUPPORT_H_

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli_app.h"
#include "tests/server/service/server_test_support.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {

// What one in-process attnserve-cli run returned and printed.
struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

// Starts the server in SetUp (fatal failure if it does not start) and remembers its port, so
// Target() still names it after StopServer(). Not thread-safe (one test thread).
class CliTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer();
    port_ = server().port();
  }

  std::string Target() const { return absl::StrCat("127.0.0.1:", port_); }

  // attnserve-cli --target <the server> --timeout-s 30 `args`, in-process.
  CliRun Run(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"--target", Target(), "--timeout-s", "30"};
    all.insert(all.end(), args.begin(), args.end());
    std::ostringstream out, err;
    CliRun run;
    run.code = cli::RunCli(all, out, err);
    run.out = out.str();
    run.err = err.str();
    return run;
  }

  TempFolder temp_;  // A scratch folder for the test's .npy files.
  int port_ = 0;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_CLIENT_CLI_CLI_TEST_SUPPORT_H_
