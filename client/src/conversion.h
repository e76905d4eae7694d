// The client's one place where protobuf meets its public types (types.h).
#ifndef ATTNSERVE_CLIENT_SRC_CONVERSION_H_
#define ATTNSERVE_CLIENT_SRC_CONVERSION_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "attnserve/client/decode.h"
#include "attnserve/client/types.h"
#include "attnserve/v1/attention.pb.h"

namespace attnserve::client::internal {

// The request for `input` and `options`. InvalidArgument naming the field when a tensor's data
// does not hold product(shape) elements (the server checks everything else).
absl::StatusOr<v1::AttendRequest> MakeAttendRequest(std::string_view model, TensorView input,
                                                    const AttendOptions& options);

// The result carried by `response` (values or raw). Internal for a malformed answer.
absl::StatusOr<AttendResult> ReadAttendResponse(const v1::AttendResponse& response);

// The DecodeRequest for `message` with the stream's `options` and `request_id`. InvalidArgument
// naming the item and field when a tensor's data does not hold product(shape) elements, or for a
// 16-bit wire type without raw.
absl::StatusOr<v1::DecodeRequest> MakeDecodeRequest(const DecodeMessage& message,
                                                    const DecodeStreamOptions& options,
                                                    const std::string& request_id);

// The answer carried by `response` to `request`: the message's error when the whole message
// failed; Internal when the answer does not have one result per item of the request.
absl::StatusOr<DecodeAnswer> ReadDecodeResponse(const v1::DecodeRequest& request,
                                                const v1::DecodeResponse& response);

ModelInfo ReadModelInfo(const v1::ModelInfo& info);

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_CONVERSION_H_
