#include "client/src/channel.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnserve::client::internal {
namespace {

// A duration in the service config's proto-JSON form ("0.050s").
std::string ConfigSeconds(std::chrono::milliseconds duration) {
  return absl::StrFormat("%.3fs", static_cast<double>(duration.count()) / 1000.0);
}

// The whole of `path`; NotFound naming `option` when it cannot be read.
absl::StatusOr<std::string> ReadPem(const char* option, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(option, ": cannot read \"", path, "\""));
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(
    const ClientOptions& options) {
  const bool has_identity =
      !options.tls_cert_chain_path.empty() || !options.tls_private_key_path.empty();
  if (options.tls_ca_path.empty()) {
    if (has_identity || !options.tls_server_name.empty()) {
      return absl::InvalidArgumentError(
          "tls_ca_path: expected a CA bundle (or \"system\") when a client certificate or "
          "tls_server_name is set");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (has_identity &&
      (options.tls_cert_chain_path.empty() || options.tls_private_key_path.empty())) {
    return absl::InvalidArgumentError(
        "tls_cert_chain_path, tls_private_key_path: expected both set (mutual TLS) or both empty");
  }
  grpc::SslCredentialsOptions ssl;
  if (options.tls_ca_path != "system") {
    absl::StatusOr<std::string> roots = ReadPem("tls_ca_path", options.tls_ca_path);
    if (!roots.ok()) return roots.status();
    ssl.pem_root_certs = *std::move(roots);
  }
  if (has_identity) {
    absl::StatusOr<std::string> chain = ReadPem("tls_cert_chain_path", options.tls_cert_chain_path);
    if (!chain.ok()) return chain.status();
    absl::StatusOr<std::string> key = ReadPem("tls_private_key_path", options.tls_private_key_path);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(chain);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

absl::Status ValidateOptions(const std::string& target, const ClientOptions& options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("target: expected host:port or a gRPC target URI, got \"\"");
  }
  if (options.default_deadline.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_deadline: expected > 0 ms, got ", options.default_deadline.count()));
  }
  if (options.max_attempts < 1 || options.max_attempts > 5) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_attempts: expected 1..5 (gRPC's cap; 1 = no retry), got ", options.max_attempts));
  }
  if (options.initial_backoff.count() <= 0 || options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial_backoff, max_backoff: expected 0 < initial_backoff <= max_backoff, got ",
        options.initial_backoff.count(), " ms and ", options.max_backoff.count(), " ms"));
  }
  if (!(options.backoff_multiplier >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff_multiplier: expected >= 1, got ", options.backoff_multiplier));
  }
  if (options.max_message_bytes < 1024 ||
      options.max_message_bytes > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes: expected 1024..2147483647, got ", options.max_message_bytes));
  }
  if (options.load_balancing_policy != "round_robin" &&
      options.load_balancing_policy != "pick_first") {
    return absl::InvalidArgumentError(
        absl::StrCat("load_balancing_policy: expected round_robin or pick_first, got \"",
                     options.load_balancing_policy, "\""));
  }
  return absl::OkStatus();
}

std::string ServiceConfigJson(const ClientOptions& options) {
  std::string config =
      absl::StrCat("{\"loadBalancingConfig\": [{\"", options.load_balancing_policy, "\": {}}]");
  if (options.max_attempts > 1) {
    absl::StrAppend(&config,
                    ", \"methodConfig\": [{\"name\": [{\"service\": "
                    "\"attnserve.v1.AttentionService\"}, {\"service\": \"grpc.health.v1.Health\"}, "
                    "{\"service\": \"inference.GRPCInferenceService\"}],"
                    " \"retryPolicy\": {\"maxAttempts\": ",
                    options.max_attempts, ", \"initialBackoff\": \"",
                    ConfigSeconds(options.initial_backoff), "\", \"maxBackoff\": \"",
                    ConfigSeconds(options.max_backoff),
                    "\", \"backoffMultiplier\": ", options.backoff_multiplier,
                    ", \"retryableStatusCodes\": [\"UNAVAILABLE\", \"RESOURCE_EXHAUSTED\", "
                    "\"CANCELLED\"]}}]");
  }
  config += "}";
  return config;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ClientOptions& options) {
  if (absl::Status status = ValidateOptions(target, options); !status.ok()) return status;
  grpc::ChannelArguments args;
  args.SetServiceConfigJSON(ServiceConfigJson(options));
  const int max_bytes = static_cast<int>(options.max_message_bytes);
  args.SetMaxReceiveMessageSize(max_bytes);
  args.SetMaxSendMessageSize(max_bytes);
  // gRPC keeps a call's request for retries only up to this size (default 256 KiB, one
  // [128, 512] tensor): beyond it a call would silently lose its retries.
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, max_bytes);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = MakeCredentials(options);
  if (!credentials.ok()) return credentials.status();
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(target, *credentials, args);
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace attnserve::client::internal
