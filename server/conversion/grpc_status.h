// ToGrpcStatus: the one conversion from the codebase's absl::Status to grpc::Status, shared by
// every wire protocol the server speaks.
#ifndef ATTNSERVE_SERVER_CONVERSION_GRPC_STATUS_H_
#define ATTNSERVE_SERVER_CONVERSION_GRPC_STATUS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace attnserve::server {

// The longest status message sent. Messages quote client strings through EchoForMessage; this
// bound is the backstop for every protocol: the message travels in trailing metadata, and past
// the client's limit (8 KiB by default) the client sees RESOURCE_EXHAUSTED instead of the error.
inline constexpr size_t kMaxStatusMessageBytes = 1024;

// The gRPC status with the same code (absl and gRPC share the numbering) and message (cut to
// kMaxStatusMessageBytes, as EchoForMessage cuts). An OK status maps to grpc::Status::OK; a code
// outside gRPC's range to UNKNOWN. Payloads are dropped. A pure function; thread-safe.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CONVERSION_GRPC_STATUS_H_
