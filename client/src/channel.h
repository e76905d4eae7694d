// The gRPC channel a Client talks through, built from ClientOptions: load-balancing policy and
// retry policy as a gRPC service config, message size limits as channel arguments.
#ifndef ATTNSERVE_CLIENT_SRC_CHANNEL_H_
#define ATTNSERVE_CLIENT_SRC_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/client/client.h"

namespace attnserve::client::internal {

// InvalidArgument naming the option when one is out of range.
absl::Status ValidateOptions(const std::string& target, const ClientOptions& options);

// The service config (JSON) for `options`: the load-balancing policy, and a retry policy for
// UNAVAILABLE and RESOURCE_EXHAUSTED on every method of the service and on health checks.
std::string ServiceConfigJson(const ClientOptions& options);

// An insecure channel to `target` with that config. Validates first.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ClientOptions& options);

// A gRPC status as an absl::Status: the same code number, the same message.
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_CHANNEL_H_
