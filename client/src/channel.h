// The gRPC channel a Client talks through, built from ClientOptions: load-balancing policy and
// retry policy as a gRPC service config, message size limits as channel arguments.
#ifndef ATTNSERVE_CLIENT_SRC_CHANNEL_H_
#define ATTNSERVE_CLIENT_SRC_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/client/client.h"

namespace attnserve::client::internal {

// InvalidArgument naming the option when one is out of range.
absl::Status ValidateOptions(const std::string& target, const ClientOptions& options);

// The service config (JSON) for `options`: the load-balancing policy, and a retry policy for
// UNAVAILABLE and RESOURCE_EXHAUSTED on every method of attnserve.v1, of the Open Inference
// Protocol's service (InferClient) and of health checks.
std::string ServiceConfigJson(const ClientOptions& options);

// Plaintext credentials when options.tls_ca_path is empty, else TLS (with this client's certificate
// when one is set), its files read now. InvalidArgument naming the option for an incomplete
// combination; NotFound naming the option for a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(
    const ClientOptions& options);

// A channel to `target` with that config and those credentials. Validates first.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ClientOptions& options);

// A gRPC status as an absl::Status: the same code number, the same message.
absl::Status FromGrpc(const grpc::Status& status);

// The time since `start`, as a call's result reports its latency.
inline std::chrono::microseconds MicrosecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_CHANNEL_H_
