// The attnserve binary's command line (CLI11): every flag, its default and its meaning, mapped
// onto ServerOptions. Flags may also come from a TOML/INI file given with --config, or from an
// environment variable ATTNSERVE_<FLAG> (--max-queue-size: ATTNSERVE_MAX_QUEUE_SIZE), which is
// what container images and Kubernetes set. Precedence: command line, then the file, then the
// environment.
#ifndef ATTNSERVE_SERVER_APP_SERVER_FLAGS_H_
#define ATTNSERVE_SERVER_APP_SERVER_FLAGS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "server/app/server_options.h"

namespace attnserve::server {

struct ServerFlags {
  ServerOptions server;
  std::string demo_model = "auto";  // auto | always | never
  std::string compute_dtype;        // "" (each model's config.json) | fp32 | bf16
  double model_poll_interval_s = 5.0;
  double shutdown_grace_s = 30.0;
  double max_connection_age_s = 0.0;
  double max_connection_age_grace_s = 30.0;
  double max_connection_idle_s = 300.0;
  double malloc_trim_interval_s = 10.0;
  double keepalive_time_s = 60.0;
  double keepalive_timeout_s = 20.0;
  int64_t kv_cache_budget_mb = 0;       // -> server.decoding.kv.budget_bytes (0: derived)
  int64_t kv_cache_prefault_mb = 16;    // -> server.decoding.kv.prefault_ahead_bytes
  std::string kv_cache_dtype = "auto";  // auto | int8 -> repository.load.default_kv_cache_dtype
  double decode_idle_timeout_s = 60.0;  // -> server.decoding.idle_timeout_us
  std::string log_level = "info";
  std::string log_format = "text";
};

// Declares every flag on `app`, bound to `flags` (which holds the defaults shown by --help), each
// with its environment variable.
void AddServerFlags(CLI::App& app, ServerFlags& flags);

// Fills the ServerOptions fields that need conversion (demo policy, seconds to ms) after parsing.
void FinishServerFlags(ServerFlags& flags);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_SERVER_FLAGS_H_
