// The attnserve binary's command line (CLI11): every flag, its default and its meaning, mapped
// onto ServerOptions. Flags may also come from a TOML/INI file given with --config (a flag on the
// command line wins over the file).
#ifndef ATTNSERVE_SERVER_SERVER_FLAGS_H_
#define ATTNSERVE_SERVER_SERVER_FLAGS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "server/server_options.h"

namespace attnserve::server {

struct ServerFlags {
  ServerOptions server;
  std::string demo_model = "auto";  // auto | always | never
  double model_poll_interval_s = 5.0;
  double shutdown_grace_s = 30.0;
  std::string log_level = "info";
  std::string log_format = "text";
};

// Declares every flag on `app`, bound to `flags` (which holds the defaults shown by --help).
void AddServerFlags(CLI::App& app, ServerFlags& flags);

// Fills the ServerOptions fields that need conversion (demo policy, seconds to ms) after parsing.
void FinishServerFlags(ServerFlags& flags);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVER_FLAGS_H_
