// `attnserve-cli models`, `info` and `health`: the server's model and health calls, printed for
// people (and, for health, an exit status for Docker's HEALTHCHECK).
//
// Each writes to `out` and returns OK, or the error for the caller to print (exit status 1).
// They call `client` only, which is thread-safe; the functions hold no state.
#ifndef ATTNSERVE_CLIENT_CLI_MODEL_COMMANDS_H_
#define ATTNSERVE_CLIENT_CLI_MODEL_COMMANDS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "attnserve/client/client.h"

namespace attnserve::cli {

// One row per serving model: name (default marked *), version, width, heads, variant, bias,
// dtype, parameters, longest sequence, source.
absl::Status ListModelsCommand(client::Client& client, std::ostream& out);

// Every field of GetModel(`model`) ("" = the default model), one "key: value" line each.
absl::Status InfoCommand(client::Client& client, const std::string& model, std::ostream& out);

// OK when `service` ("" = the server) is SERVING, printing "SERVING" unless `quiet`; otherwise
// the reason (Unavailable when not serving or unreachable, NotFound for an unknown service).
absl::Status HealthCommand(client::Client& client, const std::string& service, bool quiet,
                           std::ostream& out);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_MODEL_COMMANDS_H_
