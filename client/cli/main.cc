// attnserve-cli: a command line for attnserve servers. Run with --help.
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/cli_app.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return attnserve::cli::RunCli(args, std::cout, std::cerr);
}
