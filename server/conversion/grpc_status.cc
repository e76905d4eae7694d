#include "server/conversion/grpc_status.h"

#include <string>
#include <string_view>

#include "core/util/echo.h"

namespace attnserve::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  const bool known = code > 0 && code <= static_cast<int>(grpc::StatusCode::UNAUTHENTICATED);
  return grpc::Status(
      known ? static_cast<grpc::StatusCode>(code) : grpc::StatusCode::UNKNOWN,
      EchoForMessage(std::string_view(status.message().data(), status.message().size()),
                     kMaxStatusMessageBytes));
}

}  // namespace attnserve::server
