// ParseWireMessage / SerializeWireMessage: protobuf messages to and from gRPC's raw bytes.
//
// attnserve.v1's Attend and AttendStream take their requests as bytes (raw callback methods) and
// parse them here, so that a message protobuf cannot parse is the caller's error, answered
// INVALID_ARGUMENT with a message (and counted), not a call gRPC fails on its own before any
// handler runs (UNIMPLEMENTED with an empty message on a unary call; on a stream, the end of the
// stream with OK and every later message dropped). Pure functions; thread-safe.
#ifndef ATTNSERVE_SERVER_SERVICE_WIRE_MESSAGES_H_
#define ATTNSERVE_SERVER_SERVICE_WIRE_MESSAGES_H_

#include <grpcpp/support/byte_buffer.h>

#include <optional>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "attnserve/v1/attention.pb.h"
#include "google/protobuf/message.h"
#include "server/conversion/attnserve_v1/decode_response_encoder.h"
#include "server/runtime/attend_work.h"

namespace attnserve::server {

// Parses `bytes` into `message` (cleared first). InvalidArgument naming `what` (e.g. "request")
// and the expected message type when the bytes are not a valid serialisation of it.
absl::Status ParseWireMessage(const grpc::ByteBuffer& bytes, std::string_view what,
                              google::protobuf::Message* message);

// Serialises `message` into `bytes` (replacing what they held). Internal if protobuf fails
// (a message over 2 GiB).
absl::Status SerializeWireMessage(const google::protobuf::Message& message,
                                  grpc::ByteBuffer* bytes);

// Serialises the attnserve.v1 AttendResponse answering `work` into `bytes` (replacing what they
// held) as one slice, encoded straight from `result` (AttendResponseEncoder): the answer's floats
// are copied once. Internal if `result` does not fit `work` (as FillAttendResponse).
absl::Status SerializeAttendResponse(const AttendWork& work, const AttendResult& result,
                                     grpc::ByteBuffer* bytes);

// Serialises the attnserve.v1 DecodeResponse `response` with each step's output taken from
// `outputs` (DecodeResponseEncoder's contract) into `bytes` (replacing what they held) as one
// slice: the outputs' floats are encoded once. Internal if the encoder refuses them, or for an
// answer over protobuf's 2 GiB.
absl::Status SerializeDecodeResponse(const v1::DecodeResponse& response,
                                     std::span<const std::optional<DecodeStepOutput>> outputs,
                                     grpc::ByteBuffer* bytes);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_WIRE_MESSAGES_H_
